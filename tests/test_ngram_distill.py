"""N-grams distilled from the verifier: batched sampling matches single-sequence decoding, the
sample log resumes exactly, and the model file records where its text came from."""

from __future__ import annotations

import json

import pytest
import torch

from polyspec.assets.languages import language_from_files
from polyspec.ngram_distill import DISTILL_TOPICS, SelfCorpusSettings, Shards, distill_ngram, sample_batch, seed_prompts
from polyspec.sampling import SamplingConfig


def hf_greedy(model, prompt: list[int], new: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=new, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


@pytest.fixture
def language(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(f"w{(i * 7 + j) % 60}" for j in range(12)) for i in range(20)) + "\n")
    return language_from_files("tst", corpus=corpus, name="Testish")


def test_batched_sampling_of_unequal_prompts_equals_single_sequence_decoding(verifier):
    # top-k 1 makes sampling deterministic: each row must be the greedy continuation of its own
    # prompt, which fails if left padding leaks into attention or positions.
    settings = SelfCorpusSettings(sample_tokens=12, sampling=SamplingConfig(temperature=1.0, top_k=1))
    prompts = [[2, 5, 9, 11], [2, 7], [2, 8, 8, 8, 8, 8, 30, 31, 40]]
    outputs = sample_batch(verifier, prompts, settings, seed=0, eos=frozenset())
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output == hf_greedy(verifier.model, prompt, 12)


def test_seed_prompts_avoid_the_benchmark_topics(language):
    from polyspec.tasks import STORY_TOPICS

    assert not set(DISTILL_TOPICS) & set(STORY_TOPICS)
    kinds = {kind for kind, _ in seed_prompts(language)}
    assert kinds == {"story", "continuation"}  # a user corpus has no aligned English


def test_interrupted_generation_resumes_to_the_same_samples(verifier, language, tmp_path):
    settings = SelfCorpusSettings(tokens=60, batch=3, sample_tokens=8, seed=4)
    whole = tmp_path / "whole.ngram"
    distill_ngram(verifier, language, 2, whole, settings)
    # Stop after the first batch, damage the last line as a crash would, then resume.
    part = tmp_path / "part.ngram"
    first = SelfCorpusSettings(tokens=1, batch=3, sample_tokens=8, seed=4)
    distill_ngram(verifier, language, 2, part, first)
    log = part.with_name(part.name + ".samples") / "samples.jsonl"
    log.write_text(log.read_text() + '{"prompt": 3, "ids": [1')
    distill_ngram(verifier, language, 2, part, settings)

    def without_timing(samples):
        return [{key: value for key, value in s.items() if key != "seconds"} for s in samples]

    resumed = Shards(log.parent).read()
    assert without_timing(resumed) == without_timing(Shards(whole.with_name(whole.name + ".samples")).read())
    assert sum(len(s["ids"]) for s in resumed) >= 60


def test_model_file_records_the_distillation(verifier, language, tmp_path):
    from polyspec.ngram import load

    out = tmp_path / "d.ngram"
    settings = SelfCorpusSettings(tokens=30, batch=2, sample_tokens=8)
    distill_ngram(verifier, language, 2, out, settings, mix=["w1 w2 w3"], mix_weight=2)
    meta = load(out).metadata
    assert meta["distilled_from"] == verifier.name
    assert meta["language"] == "tst"
    assert int(meta["sampled_tokens"]) >= 30
    assert json.loads(meta["settings"])["sampling"]["top_k"] == 50
    assert meta["mix_documents"] == "1" and meta["mix_weight"] == "2"
