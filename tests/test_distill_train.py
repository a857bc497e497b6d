"""Distillation training on tiny models: it lowers the loss, checkpoints resume exactly, the
verifier's outputs are cached, and the training data stays outside the benchmark's split."""

from __future__ import annotations

import json
import re

import pytest
import torch
from fixtures import VOCAB_WORDS, install_fake_udhr, run_cli

from polyspec.assets import languages
from polyspec.assets.languages import Language
from polyspec.distill import data as teacher
from polyspec.distill.data import DataOptions
from polyspec.distill.init import VocabSource, init_drafter
from polyspec.distill.trainer import TrainConfig, Trainer, batch_indices, train
from polyspec.drafters.distilled import load_drafter, read_meta
from polyspec.errors import UserError

pytestmark = pytest.mark.slow  # trains drafters


def words(seed: int, count: int) -> str:
    return " ".join(f"w{(seed * 7 + j * 11) % VOCAB_WORDS}" for j in range(count))


@pytest.fixture
def language(tmp_path, monkeypatch):
    """'tst': a corpus of word sequences and a training TSV, no UDHR text."""
    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(languages, "_registered", {})
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(words(i, 12) for i in range(40)), encoding="utf-8")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("\n".join(f"{words(i, 3)}\t{words(i + 50, 4)}" for i in range(8)), encoding="utf-8")
    languages.register(Language("tst", "Testish", "Latn", corpus=corpus))
    return pairs


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory, verifier_dir):
    out = tmp_path_factory.mktemp("distill") / "baseline"
    lines = [words(i, 12) for i in range(40)]
    init_drafter(str(verifier_dir), 2, out, 48, [VocabSource("test", tuple(lines))])
    return out


def config(verifier_dir, drafter_dir, out, pairs, **overrides) -> TrainConfig:
    data = {"kind": "translation", "language": "tst", "max_new_tokens": 8, "samples": 2, "parallel": str(pairs)}
    data |= overrides.pop("data", {})
    settings = {"steps": 12, "batch_size": 4, "lr": 3e-3, "warmup": 2, "device": "cpu", "teacher_dtype": "float32"}
    settings["mixed_precision"] = "no"  # the same numbers on every CPU
    settings |= overrides
    return TrainConfig(str(verifier_dir), str(drafter_dir), str(out), DataOptions(**data), **settings)


@pytest.mark.parametrize(
    "loss, data, on_policy",
    [
        ("fkl", {}, False),
        ("rkl", {"top_k": 0}, False),  # full distributions, asked of the verifier as it goes
        ("tvd", {"kind": "monolingual", "window": 16}, False),
        ("fkl", {}, True),
    ],
)
def test_a_few_steps_lower_the_loss(verifier_dir, drafter_dir, language, tmp_path, loss, data, on_policy):
    settings = config(verifier_dir, drafter_dir, tmp_path / "out", language, loss=loss, data=data, on_policy=on_policy)
    report = train(settings, show_progress=False, evaluate=not on_policy)
    if on_policy:  # fresh samples every step: compare the first and last steps
        assert report.loss_last < 0.8 * report.loss_first
    else:
        before, after = report.eval_loss
        assert after < 0.8 * before
    assert read_meta(tmp_path / "out").training[-1]["loss"] == loss
    assert (tmp_path / "out" / "training-log.jsonl").is_file() and not settings.state_dir.exists()


def test_training_moves_agreement_with_the_verifier(verifier_dir, tmp_path, language):
    # A full-vocabulary drafter on monolingual windows: top-1 agreement must rise.
    base = tmp_path / "full"
    init_drafter(str(verifier_dir), 2, base)
    data = {"kind": "monolingual", "window": 16}
    report = train(
        config(verifier_dir, base, tmp_path / "out", language, data=data, steps=30), show_progress=False, evaluate=True
    )
    assert report.eval_top1[1] > report.eval_top1[0]


def test_resume_continues_exactly_where_a_run_stopped(verifier_dir, drafter_dir, language, tmp_path, monkeypatch):
    straight = config(verifier_dir, drafter_dir, tmp_path / "straight", language, steps=6, save_every=3)
    train(straight, show_progress=False)

    stopped = config(verifier_dir, drafter_dir, tmp_path / "stopped", language, steps=6, save_every=3)
    step = Trainer.step

    def interrupted(self, data, index):
        if index == 4:
            raise KeyboardInterrupt
        return step(self, data, index)

    monkeypatch.setattr(Trainer, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(stopped, show_progress=False)
    monkeypatch.setattr(Trainer, "step", step)
    assert json.loads((stopped.state_dir / "latest.json").read_text())["step"] == 3
    with pytest.raises(UserError, match="--resume"):
        train(stopped, show_progress=False)
    with pytest.raises(UserError, match="other options"):
        train(config(verifier_dir, drafter_dir, tmp_path / "stopped", language, steps=6, lr=1e-3), resume=True)
    report = train(stopped, resume=True, show_progress=False)
    assert len(report.history) == 3 and report.history[0]["step"] == 4

    a = load_drafter(tmp_path / "straight", torch.float32).state_dict()
    b = load_drafter(tmp_path / "stopped", torch.float32).state_dict()
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def test_a_saved_drafter_loads_back_as_it_was_trained(verifier, verifier_dir, drafter_dir, language, tmp_path):
    settings = config(verifier_dir, drafter_dir, tmp_path / "out", language, steps=3)
    trainer = Trainer(settings, show_progress=False)
    trainer.run(keep_checkpoints=True)
    assert (settings.state_dir / "step-000003" / "trainable.safetensors").is_file()
    loaded = load_drafter(tmp_path / "out", torch.float32).eval()
    trained = trainer.drafter.eval()
    ids = torch.tensor([[2, 5, 9, 11, 30, 7]])
    with torch.inference_mode():
        torch.testing.assert_close(loaded(ids).logits, trained(ids).logits)
    original = load_drafter(drafter_dir, torch.float32)
    assert not torch.equal(original.lm_head.weight, loaded.lm_head.weight)  # the head trained ...
    torch.testing.assert_close(
        original.get_input_embeddings().weight, loaded.get_input_embeddings().weight
    )  # ... not these


def test_the_verifiers_outputs_are_cached_and_reused(verifier, language, tmp_path):
    options = DataOptions(kind="translation", language="tst", max_new_tokens=5, samples=2, parallel=str(language))
    first, path, hit = teacher.cached(verifier, options, tmp_path)
    again, same, hit_again = teacher.cached(verifier, options, tmp_path)
    assert not hit and hit_again and path == same
    assert first.sequences == again.sequences and first.starts == again.starts
    for a, b in zip(first.target_logprobs, again.target_logprobs, strict=True):
        torch.testing.assert_close(a, b)
    _, other, _ = teacher.cached(verifier, DataOptions(**{**options.__dict__, "top_k": 5}), tmp_path)
    assert other != path
    # Each sequence is prompt + 5 verifier tokens, with a target row per generated token.
    assert all(len(ids) == 5 and first.positions(i) == 5 for i, ids in enumerate(first.target_ids))
    assert all(torch.all(lp[:, :-1] >= lp[:, 1:]) for lp in first.target_logprobs)  # sorted top-k


def test_greedy_targets_are_the_verifiers_own_greedy_output(verifier, language):
    options = DataOptions(kind="translation", language="tst", max_new_tokens=6, samples=1, parallel=str(language))
    data = teacher.build(verifier, options)
    for sequence, start, ids in zip(data.sequences, data.starts, data.target_ids, strict=True):
        prompt = sequence[: start + 1]
        expected = verifier.model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=6, pad_token_id=0)
        assert sequence[start + 1 :] == expected[0, len(prompt) :].tolist()
        assert ids[:, 0].tolist() == sequence[start + 1 :]  # top-1 is what greedy decoding chose


def test_monolingual_windows_start_with_bos_and_cover_the_text(tokenizer):
    paragraphs = [words(i, 10) for i in range(5)]
    cut = teacher.windows(tokenizer, paragraphs, 8)
    assert all(w[0] == tokenizer.bos_token_id and len(w) <= 8 for w in cut)
    stream = [t for w in cut for t in w[1:]]
    assert stream == [t for p in paragraphs for t in tokenizer(p, add_special_tokens=False)["input_ids"]][: len(stream)]


def test_every_example_is_visited_once_per_epoch_across_processes():
    for processes in (1, 3):
        seen = [
            i for step in range(4) for rank in range(processes) for i in batch_indices(step, rank, processes, 2, 8, 0)
        ]
        epochs = [sorted(seen[k : k + 8]) for k in range(0, len(seen) - 7, 8)]
        assert all(epoch == list(range(8)) for epoch in epochs)


def test_translation_data_comes_from_the_training_split_only(tmp_path, monkeypatch, tokenizer):
    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path / "home"))
    install_fake_udhr(tmp_path / "home")
    items = teacher.translation_items(languages.get_language("yor"), None)
    articles = {int(re.search(r"article (\d+)", item.target).group(1)) for item in items}
    assert articles <= set(range(21)) and len(articles) > 10
    prompts = teacher.translation_prompts(languages.get_language("yor"), items, 1, 0)
    assert all(not re.search(r"article (2[1-9]|30) ", p) for p in prompts)
    assert prompts[0].startswith("Translate from English to Yoruba.") and prompts[0].endswith("Yoruba:")


def test_bad_training_settings_are_user_errors(verifier_dir, drafter_dir, language, tmp_path):
    with pytest.raises(UserError, match="loss"):
        config(verifier_dir, drafter_dir, tmp_path / "o", language, loss="mse")
    with pytest.raises(UserError, match="data"):
        DataOptions(kind="parallel", language="tst")
    with pytest.raises(UserError, match="steps"):
        config(verifier_dir, drafter_dir, tmp_path / "o", language, steps=0)
    with pytest.raises(UserError, match="--parallel"):
        teacher.translation_items(languages.get_language("tst"), None)


def test_cli_train_writes_the_languages_task_drafter(verifier_dir, drafter_dir, language, tmp_path):
    args = ["distill", "train", "--verifier", str(verifier_dir), "--language", "tst", "--data", "translation"]
    code, _, err = run_cli(*args, "--steps", "2")
    assert code == 2 and "polyspec distill init --language tst" in err  # no baseline yet
    options = ["--drafter", str(drafter_dir), "--parallel", str(language), "--steps", "3", "--batch-size", "2"]
    options += ["--max-new-tokens", "4", "--samples", "1", "--dtype", "float32", "--mixed-precision", "no"]
    options += ["--no-progress", "--json"]
    code, out, err = run_cli(*args, *options)
    assert code == 0, err
    report = json.loads(out)
    task = tmp_path / "home" / "distill" / "tst" / "task"
    assert report["out"] == str(task) and report["steps"] == 3 and not report["cache_hit"]
    assert read_meta(task).training[0]["data"]["kind"] == "translation"
    code, out, _ = run_cli(*args, *options)
    assert code == 0 and json.loads(out)["cache_hit"]  # the verifier's outputs came from the cache
