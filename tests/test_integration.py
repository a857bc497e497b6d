"""The real embedded verifier (Gemma-3-270M, 262k vocabulary, sliding-window layers): greedy
identity with transformers in float32, for prompt lookup and an n-gram drafter trained on the
UDHR corpus split. Needs the assets fetched by scripts/setup.sh; skipped without them."""

from __future__ import annotations

import pytest
import torch

from polyspec.assets.store import is_present

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not is_present("verifier"), reason="embedded verifier not fetched (polyspec assets fetch)"),
]


@pytest.fixture(scope="module")
def gemma():
    from polyspec.specs import load_model

    torch.set_num_threads(2)
    yield load_model("gemma3-270m", dtype="float32")
    torch.set_num_threads(1)


def test_bos_is_added(gemma):
    assert gemma.tokenizer("Hello")["input_ids"][0] == gemma.tokenizer.bos_token_id == 2


def test_greedy_identity_on_the_real_verifier(gemma, tmp_path):
    from polyspec.decoding import Decoder
    from polyspec.ngram.train import train
    from polyspec.specs import make_drafter
    from polyspec.tasks import build_prompts, corpus_text

    model_path = tmp_path / "yor.ngram"
    train(gemma.tokenizer, corpus_text("yor"), 3, model_path, show_progress=False)
    decoder = Decoder(gemma)
    prompts = [p.text for p in build_prompts("yor", "continuation", limit=2)]
    prompts.append("Article 1. All human beings are born free and equal. Article 2. All human beings")
    for text in prompts:
        ids = decoder.encode(text)
        expected = gemma.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=24)[0, len(ids) :]
        for spec in ("prompt-lookup", f"ngram:{model_path}+context"):
            result = decoder.generate(ids, make_drafter(spec, gemma), gamma=3, max_new_tokens=24)
            assert result.token_ids == expected.tolist(), (spec, text)


def test_bench_smoke_on_the_real_verifier(tmp_path, monkeypatch):
    """A thin slice of the quick preset through the command line, report included."""
    import json
    import sys

    from polyspec.cli import main

    out = tmp_path / "bench"
    args = ["bench", "--preset", "quick", "--languages", "yor", "--tasks", "continuation", "--limit", "1"]
    args += ["--drafters", "none,ngram,prompt-lookup", "--max-new-tokens", "12", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", ["polyspec", *args])
    main()
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["drafter"] for r in records} == {"none", "ngram", "prompt-lookup"}
    assert all(r["new_tokens"] == 12 for r in records)
    assert (out / "report.md").exists() and (out / "f_by_language.png").exists()
