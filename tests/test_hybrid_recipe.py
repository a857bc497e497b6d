"""The study's full-scale recipe: its dry run builds the real architectures (shrunk) and runs every
configuration; the real run stops at once, with a clear message, when the weights are out of
reach."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from polyspec.bench import recipe as recipe_module
from polyspec.bench.recipe import (
    DRY_RUN_TEXTS,
    KNOWN_CONFIGS,
    LANGUAGE_NAMES,
    STUDY_RECIPE,
    run_recipe,
    shrunk_config,
    story_prompts,
)
from polyspec.errors import UserError
from polyspec.sampling import STUDY_SAMPLING


def test_study_recipe_has_the_study_settings():
    assert (STUDY_RECIPE.verifier, STUDY_RECIPE.drafter) == ("Qwen/Qwen3.5-9B", "Qwen/Qwen3.5-0.8B")
    assert STUDY_RECIPE.gammas == (2, 3, 4, 5) and STUDY_RECIPE.modes == ("greedy", "sampling")
    assert STUDY_RECIPE.sampling == STUDY_SAMPLING
    assert (STUDY_SAMPLING.top_k, STUDY_SAMPLING.top_p, STUDY_SAMPLING.repetition_penalty) == (50, 0.9, 1.1)
    assert STUDY_SAMPLING.penalty_window == 16
    assert len(STUDY_RECIPE.languages) == 12
    for code in STUDY_RECIPE.languages:
        assert len(DRY_RUN_TEXTS[code]) == 2 and all(DRY_RUN_TEXTS[code])
        assert LANGUAGE_NAMES[code] in story_prompts(code, 1)[0]


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


def test_dry_run_runs_every_configuration(tmp_path):
    languages = ("amh", "zh")  # two scripts; every language's texts are checked above
    recipe = replace(STUDY_RECIPE, languages=languages, prompts_per_language=1)
    records = run_recipe(recipe, dry_run=True, out_dir=tmp_path, progress=False)
    configurations = {(r["language"], r["mode"], r["gamma"]) for r in records}
    expected = {(code, mode, gamma) for code in languages for mode in recipe.modes for gamma in (0, *recipe.gammas)}
    assert configurations == expected and len(records) == len(expected)
    for record in records:
        assert record["new_tokens"] == max(recipe.gammas) + 1 and record["verifier_calls"] >= 1
        if record["gamma"]:
            assert record["drafted"] >= 1 and record["drafter"] == "model:Qwen/Qwen3.5-0.8B"
        if record["mode"] == "greedy" and record["gamma"]:
            assert record["same_as_plain"], record
    lines = (tmp_path / "study-dry-run.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == records


def test_full_run_stops_early_when_the_hub_is_unreachable(tmp_path, monkeypatch):
    monkeypatch.setattr(recipe_module, "hub_reachable", lambda: False)
    monkeypatch.setattr(recipe_module, "_cached", lambda name: False)

    def must_not_load(*args, **kwargs):
        raise AssertionError("loaded a model before checking that the weights are reachable")

    monkeypatch.setattr(recipe_module.LoadedModel, "load", must_not_load)
    with pytest.raises(UserError, match="hub is unreachable") as error:
        run_recipe(STUDY_RECIPE, dry_run=False, out_dir=tmp_path, progress=False)
    assert "Qwen/Qwen3.5-9B" in str(error.value) and "\n" not in str(error.value)
    assert not list(tmp_path.iterdir())


def test_unknown_languages_and_modes_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="xx"):
        run_recipe(replace(STUDY_RECIPE, languages=("xx",)), dry_run=True, out_dir=tmp_path, progress=False)
    with pytest.raises(UserError, match="beam"):
        run_recipe(replace(STUDY_RECIPE, modes=("beam",)), dry_run=True, out_dir=tmp_path, progress=False)
