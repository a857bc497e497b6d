"""The study's full-scale preset (`--recipe study`): the benchmark's runner and records; its dry
run builds the real architectures (shrunk) and runs every configuration; the real run stops at
once, with a clear message, when the weights are out of reach."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from fixtures import run_cli

from polyspec.assets.languages import STUDY_CODES, get_language
from polyspec.bench.grid import PRESETS, record_key
from polyspec.bench.recipe import KNOWN_CONFIGS, shrunk_config
from polyspec.bench.report import write_report
from polyspec.bench.results import read_records
from polyspec.bench.runner import run_bench, sampling_for
from polyspec.errors import UserError
from polyspec.sampling import STUDY_SAMPLING
from polyspec.tasks import build_prompts

STUDY = PRESETS["study"]


def test_study_preset_has_the_study_settings():
    assert (STUDY.verifier, STUDY.drafters) == ("Qwen/Qwen3.5-9B", ("none", "model:Qwen/Qwen3.5-0.8B"))
    assert STUDY.gammas == (2, 3, 4, 5) and STUDY.modes == ("greedy", "sample") and STUDY.tasks == ("story",)
    assert sampling_for("sample") == STUDY_SAMPLING
    assert (STUDY_SAMPLING.top_k, STUDY_SAMPLING.top_p, STUDY_SAMPLING.repetition_penalty) == (50, 0.9, 1.1)
    assert STUDY_SAMPLING.penalty_window == 16
    assert STUDY.languages == STUDY_CODES and len(STUDY.languages) == 12
    for code in STUDY.languages:  # story prompts name the language as the registry does
        prompts = build_prompts(code, "story", STUDY.limit, STUDY.seed)
        assert len(prompts) == 2 and all(f"Write a story in {get_language(code).name} about" in p.text for p in prompts)
    assert "Kabyle" in build_prompts("ber", "story", 1)[0].text


@pytest.mark.parametrize(("name", "parameters"), [("Qwen/Qwen3.5-9B", 8.95e9), ("Qwen/Qwen3.5-0.8B", 0.75e9)])
def test_known_configs_give_the_published_model_sizes(name, parameters):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    with torch.device("meta"):  # shapes only, no memory
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**KNOWN_CONFIGS[name]))
    count = sum(p.numel() for p in model.parameters())
    assert abs(count - parameters) / parameters < 0.01


@pytest.mark.parametrize("name", list(KNOWN_CONFIGS))
def test_dry_run_configs_keep_the_layer_pattern_and_heads(name):
    from transformers import Qwen3_5TextConfig

    real, small = Qwen3_5TextConfig(**KNOWN_CONFIGS[name]), shrunk_config(name, vocab_size=320)
    assert small.hidden_size < real.hidden_size and small.num_hidden_layers < real.num_hidden_layers
    assert small.layer_types == real.layer_types[: small.num_hidden_layers]
    for field in ("num_attention_heads", "num_key_value_heads", "linear_num_key_heads", "linear_num_value_heads"):
        assert getattr(small, field) == getattr(real, field), field
    assert small.tie_word_embeddings == real.tie_word_embeddings
    rope = small.rope_parameters
    assert sum(rope["mrope_section"]) == int(small.head_dim * rope["partial_rotary_factor"]) // 2


def test_dry_run_runs_every_configuration_into_the_benchmarks_records(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path / "home"))
    languages = ("amh", "zh")  # two scripts
    config = replace(STUDY, languages=languages, limit=1)
    path = run_bench(config, tmp_path / "out", resume=False, show_progress=False, dry_run=True)
    records = read_records(path)
    configurations = {(r["language"], r["mode"], r["gamma"]) for r in records}
    expected = {(code, mode, gamma) for code in languages for mode in config.modes for gamma in (0, *config.gammas)}
    assert configurations == expected and len(records) == len(expected)
    for record in records:
        assert record["new_tokens"] == max(config.gammas) + 1 and record["verifier_calls"] >= 1
        assert record["dry_run"] and record["dtype"] == "float32" and record["verifier"] == "Qwen/Qwen3.5-9B"
        assert len(record_key(record)) == 7 and record["task"] == "story"
        if record["gamma"]:
            assert record["drafted"] >= 1 and record["drafter"] == "model:Qwen/Qwen3.5-0.8B"
        if record["mode"] == "greedy":
            assert record["identical"], record
    report = write_report([path], tmp_path / "report").read_text()
    assert "model:Qwen/Qwen3.5-0.8B" in report and "## story, sample" in report


def test_recipe_and_dry_run_on_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path / "home"))
    out = tmp_path / "cli"
    args = ["bench", "--recipe", "study", "--dry-run", "--languages", "yor", "--limit", "1", "--modes", "greedy"]
    code, _, err = run_cli(*args, "--gammas", "2", "--out", str(out))
    assert code == 0, err
    assert {r["gamma"] for r in read_records(out / "results.jsonl")} == {0, 2} and (out / "report.md").is_file()
    for bad in (["--recipe", "study", "--dry-run", "--languages", "xx"], ["--recipe", "study", "--modes", "beam"]):
        code, _, err = run_cli("bench", *bad, "--out", str(tmp_path / "bad"))
        assert code == 2 and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("local_verifier", [False, True])
def test_full_run_stops_before_loading_when_a_model_is_missing(tmp_path, monkeypatch, verifier_dir, local_verifier):
    import polyspec.models

    monkeypatch.setattr(polyspec.models, "hub_reachable", lambda: False)

    def must_not_load(*args, **kwargs):
        raise AssertionError("loaded a model before checking that every model can be found")

    monkeypatch.setattr(polyspec.models.LoadedModel, "load", must_not_load)
    config = replace(STUDY, verifier=str(verifier_dir)) if local_verifier else STUDY
    missing = "Qwen/Qwen3.5-0.8B" if local_verifier else "Qwen/Qwen3.5-9B"
    with pytest.raises(UserError, match="hub is unreachable") as error:
        run_bench(config, tmp_path / "out", resume=False, show_progress=False)
    assert missing in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()
