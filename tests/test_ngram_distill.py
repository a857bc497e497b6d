"""N-grams distilled from the verifier: batched sampling matches single-sequence decoding, the
sample log resumes exactly, and the model file records where its text came from."""

from __future__ import annotations

import json

import pytest
import torch

from polyspec.assets.languages import language_from_files
from polyspec.errors import UserError
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
        assert output.ids == hf_greedy(verifier.model, prompt, 12)
        # top-k 1 leaves one candidate at each position, the token drawn, with all the mass
        assert output.top_ids == [[token] for token in output.ids] and output.top_probs == [[1.0]] * 12


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
        return [{key: value for key, value in s.items() if key not in ("seconds", "cpu_seconds")} for s in samples]

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


def test_model_file_records_the_seed_prompts_sampler_and_extra_metadata(verifier, language, tmp_path):
    from polyspec.ngram import load
    from polyspec.ngram_distill import SAMPLER_VERSION, prompts_fingerprint

    out = tmp_path / "d.ngram"
    settings = SelfCorpusSettings(tokens=10, batch=2, sample_tokens=6)
    report = distill_ngram(verifier, language, 2, out, settings, metadata={"distilled_from": "tiny", "x": "1"})
    meta = load(out).metadata
    prompts = seed_prompts(language)
    assert meta["seed_prompts_sha256"] == prompts_fingerprint(prompts) and meta["seed_prompts"] == str(len(prompts))
    assert json.loads(meta["seed_prompt_kinds"]) == {"story": len(DISTILL_TOPICS), "continuation": len(prompts) - 24}
    assert meta["distilled_from"] == "tiny" and meta["x"] == "1"  # given entries win
    assert meta["sampler_version"] == str(SAMPLER_VERSION)
    assert (meta["verifier_dtype"], meta["verifier_device"]) == ("float32", "cpu")
    assert json.loads(meta["settings"])["tokens"] == 10
    assert int(meta["sampled_tokens"]) == sum(len(s["ids"]) for s in Shards(out.with_name("d.ngram.samples")).read())
    assert report.metadata["text_sha256"] == meta["text_sha256"]


def _distill_args(verifier_dir, tmp_path, *more: str) -> list[str]:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12\nw3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14\n")
    return ["ngram", "distill", "--language", "yor", "--corpus", str(corpus), "--out", str(tmp_path / "d.ngram"),
            "--verifier", str(verifier_dir), "--tokens", "8", "--batch", "2", "--sample-tokens", "4",
            "--order", "2", "--no-progress", "--dtype", "float32", *more]  # fmt: skip


def test_distill_command_on_an_explicit_cpu_device(verifier_dir, tmp_path):
    from fixtures import run_cli

    from polyspec.ngram import load

    args = _distill_args(verifier_dir, tmp_path, "--device", "cpu", "--threads", "1", "--json")
    code, out, err = run_cli(*args)
    assert code == 0, err
    report = json.loads(out)
    meta = load(tmp_path / "d.ngram").metadata
    assert meta["verifier_device"] == "cpu" and meta["distilled_from"] == str(verifier_dir)
    assert len(meta["verifier_fingerprint"]) == 64 and report["tokens"] > 0


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("cuda", "polyspec: error: device 'cuda' requested but no CUDA device is available: use --device cpu"),
        ("cuda:1", "polyspec: error: device 'cuda:1' requested but no CUDA device is available: use --device cpu"),
        ("gpu", "polyspec: error: unknown device 'gpu': use cpu, cuda, cuda:N or auto"),
        ("cuda:x", "polyspec: error: unknown device 'cuda:x': use cpu, cuda, cuda:N or auto"),
    ],
)
def test_a_missing_or_unknown_device_is_one_line_before_anything_loads(
    monkeypatch, verifier_dir, tmp_path, device, message
):
    from fixtures import run_cli

    import polyspec.specs

    def no_loading(*args, **kwargs):
        raise AssertionError("the verifier was loaded")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(polyspec.specs, "load_model", no_loading)
    code, out, err = run_cli(*_distill_args(verifier_dir, tmp_path, "--device", device))
    assert (code, out, err.strip()) == (2, "", message)


def test_auto_device_without_cuda_samples_on_the_cpu(monkeypatch):
    from polyspec.commands.ngram_distill import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("auto") == "cuda" and resolve_device("cuda:0") == "cuda:0"
    with pytest.raises(Exception, match="there are 1 CUDA devices"):
        resolve_device("cuda:1")


def test_the_command_and_the_benchmark_sample_the_same_default_number_of_tokens():
    import inspect

    from polyspec.bench.grid import BenchConfig
    from polyspec.commands.ngram_distill import distill

    command_default = inspect.signature(distill).parameters["tokens"].default
    bench_default = BenchConfig.__dataclass_fields__["distill_tokens"].default
    assert command_default == bench_default == SelfCorpusSettings().tokens


def test_soft_counts_hold_the_verifier_probabilities_of_a_context_seen_once():
    from polyspec.ngram_distill import SAMPLE_UNIT, sample_counts

    share = SAMPLE_UNIT - 1
    # One sample 5 6: the verifier gave 6 and 7 half each after 5, so 6 counts 1 + share / 2.
    sample = {"ids": [5, 6], "top_ids": [[5], [6, 7]], "top_probs": [[1.0], [0.5, 0.5]]}
    counts = sample_counts([sample], 2, 10, stop=frozenset()).to_dict()
    assert counts[(5, 7)] == round(share / 2) and counts[(5, 6)] == 1 + round(share / 2)
    assert counts[(5,)] == 1 + share and counts[(7,)] == round(share / 2)
    # A log that kept no candidates counts each drawn token a whole unit; a stop token ends it.
    old = sample_counts([{"ids": [5, 6, 1, 4]}], 2, 10, stop=frozenset([1])).to_dict()
    assert old == {(5,): SAMPLE_UNIT, (6,): SAMPLE_UNIT, (5, 6): SAMPLE_UNIT}
    # A stop token among the candidates is not counted either.
    stopped = sample_counts([{**sample, "top_ids": [[5], [6, 1]]}], 2, 10, stop=frozenset([1])).to_dict()
    assert (1,) not in stopped and (5, 1) not in stopped


def test_a_corpus_weighing_zero_is_left_out_and_a_weighed_one_adds_its_counts(verifier, language, tmp_path):
    from polyspec.ngram import load
    from polyspec.ngram.query import ROOT
    from polyspec.tasks import corpus_text

    settings = SelfCorpusSettings(tokens=20, batch=2, sample_tokens=6)
    samples = tmp_path / "samples"
    unigrams = {}
    for weight, mix in ((None, None), (0, corpus_text(language)), (2, corpus_text(language))):
        out = tmp_path / f"w{weight}.ngram"
        distill_ngram(verifier, language, 2, out, settings, mix=mix, corpus_weight=weight or 0, samples_dir=samples)
        ids, counts = load(out).continuations(*ROOT)
        unigrams[weight] = dict(zip(ids.tolist(), counts.tolist(), strict=True))
    assert unigrams[0] == unigrams[None] and all(unigrams[0].values())
    assert sum(unigrams[2].values()) > sum(unigrams[0].values())
    with pytest.raises(UserError, match="weigh"):
        distill_ngram(verifier, language, 2, tmp_path / "x.ngram", settings, mix_weight=0, samples_dir=samples)


def test_the_distilled_model_drafts_what_the_verifier_found_most_probable(verifier, language, tmp_path):
    from polyspec.ngram import load
    from polyspec.ngram_distill import SAMPLE_UNIT, eos_ids

    out = tmp_path / "d.ngram"
    sharp = SamplingConfig(temperature=0.3)  # the tiny random verifier is nearly uniform at 1
    distill_ngram(verifier, language, 2, out, SelfCorpusSettings(tokens=40, batch=2, sample_tokens=10, sampling=sharp))
    samples = Shards(out.with_name("d.ngram.samples")).read()
    model = load(out)
    stop = eos_ids(verifier)
    seen: dict[int, list] = {}
    for sample in samples:
        ids = sample["ids"]
        end = next((i for i, t in enumerate(ids) if t in stop), len(ids))  # counting ends there
        for i in range(1, end):
            seen.setdefault(sample["ids"][i - 1], []).append((sample["top_ids"][i], sample["top_probs"][i]))
    # Where a token was followed once and the verifier's top candidate led by more than the
    # token drawn (counting once) and rounding can make up, that candidate is the best draft.
    clear = 3 / (SAMPLE_UNIT - 1)
    checked = 0
    for context, [(ids, probs)] in ((c, tops) for c, tops in seen.items() if len(tops) == 1):
        if len(probs) == 1 or probs[0] - probs[1] > clear:
            assert model.top([context], 1)[0].token_id == ids[0]
            checked += 1
    assert checked


# Rows giving 3 and 12 of 256 tokens (drawn among the best 12 of every row, fewer than the 5
# candidates kept in one row), and rows giving all of them (drawn from the whole vocabulary).
@pytest.mark.parametrize("supports", [(3, 12), (256, 256)])
def test_draws_with_candidates_follow_each_rows_distribution(supports):
    from scipy import stats

    from polyspec.ngram_distill import draw_with_candidates

    generator = torch.Generator().manual_seed(3)
    probs = torch.rand(2, 256, generator=generator) + 0.2
    for row, support in zip(probs, supports, strict=True):
        row[torch.randperm(256, generator=generator)[support:]] = 0.0
    probs /= probs.sum(dim=-1, keepdim=True)
    trials = 6000
    drawn, top_ids, top_probs = draw_with_candidates(probs.repeat(trials, 1), 5, generator)
    assert torch.equal(top_probs[:2], probs.topk(5, dim=-1).values)
    assert torch.equal(probs.gather(-1, top_ids[:2]), top_probs[:2])
    for row in range(2):
        counts = torch.bincount(drawn[row::2], minlength=256).numpy()
        support = probs[row] > 0
        assert counts[~support.numpy()].sum() == 0
        expected = probs[row][support].double().numpy()
        expected *= trials / expected.sum()
        assert stats.chisquare(counts[support.numpy()], expected).pvalue > 1e-3
