"""The n-gram drafter in the engine: spec parsing, greedy identity with transformers, proper draft
distributions when sampling, the live context cache, and tokenizer checks."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import build_tokenizer, check_sampling_is_exact, hf_greedy
from scipy import stats

from polyspec.decoding import Decoder
from polyspec.drafters.ngram import ContextCache, NGramOptions
from polyspec.errors import UserError
from polyspec.ngram.train import train_files
from polyspec.sampling import LogitsProcessor, SamplingConfig
from polyspec.specs import make_drafter, parse_ngram


def words(tokenizer, ids: list[int]) -> str:
    return " ".join(tokenizer.convert_ids_to_tokens(ids))


@pytest.fixture(scope="module")
def models(tmp_path_factory, verifier, tokenizer) -> dict[int, Path]:
    """Models of order 1-4 trained on the verifier's own greedy continuations (so drafts are
    often right) and on random word salad (so many contexts are unseen or misleading)."""
    root = tmp_path_factory.mktemp("ngram-models")
    decoder = Decoder(verifier)
    rng = random.Random(0)
    lines = []
    for _ in range(12):
        prompt = [rng.randrange(4, 64) for _ in range(4)]
        continuation = decoder.generate([2, *prompt], max_new_tokens=40, eos_token_ids=frozenset()).token_ids
        lines.append(words(verifier.tokenizer, prompt + continuation))
    for _ in range(30):
        lines.append(words(verifier.tokenizer, [rng.randrange(4, 64) for _ in range(rng.randint(1, 12))]))
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    paths = {}
    for order in (1, 2, 3, 4):
        paths[order] = root / f"order{order}.ngram"
        train_files(tokenizer, [corpus], order, paths[order], show_progress=False)
    return paths


@pytest.mark.parametrize(
    ("argument", "expected"),
    [
        ("m.ngram", ("m.ngram", NGramOptions())),
        ("m.ngram+context", ("m.ngram", NGramOptions(use_context=True))),
        ("m.ngram?backoff=none", ("m.ngram", NGramOptions(backoff=False))),
        (
            "dir/m.ngram+context?backoff=longest&min_prob=0.25&context_order=3",
            ("dir/m.ngram", NGramOptions(True, True, 0.25, 3)),
        ),
        ("a?b.ngram?min_prob=0.5", ("a?b.ngram", NGramOptions(min_prob=0.5))),
    ],
)
def test_spec_grammar(argument, expected):
    assert parse_ngram(argument) == expected


@pytest.mark.parametrize(
    "argument",
    [
        "",
        "+context",
        "m.ngram?backoff=some",
        "m.ngram?min_prob=2",
        "m.ngram?min_prob=x",
        "m.ngram?speed=9",
        "m.ngram?min_prob=0.1&min_prob=0.2",
        "m.ngram?context_order=1",
        "m.ngram?oops",
    ],
)
def test_bad_specs_are_user_errors(argument):
    with pytest.raises(UserError):
        parse_ngram(argument)


SPECS = ["{o2}", "{o3}", "{o4}", "{o1}", "{o2}?backoff=none", "{o3}?backoff=none", "{o2}+context", "{o4}+context",
         "{o3}?min_prob=0.6", "{o2}+context?backoff=none&context_order=5"]  # fmt: skip


@pytest.mark.parametrize("spec", SPECS)
def test_greedy_identity_with_transformers(verifier, models, spec):
    decoder = Decoder(verifier)
    drafter = make_drafter("ngram:" + spec_for(spec, models), verifier)
    rng = random.Random(1)
    accepted = 0
    for gamma in (2, 5):
        for _ in range(2):
            prompt = [2, *[rng.randrange(4, 64) for _ in range(rng.randint(1, 8))]]
            result = decoder.generate(prompt, drafter, gamma=gamma, max_new_tokens=30)
            assert result.token_ids == hf_greedy(verifier.model, prompt, 30)
            accepted += result.stats.accepted
    assert accepted > 0  # speculation really happened


def test_tokenizer_mismatch_is_refused(verifier, tmp_path):
    other = build_tokenizer()
    other.add_tokens(["extra-word"])
    corpus = tmp_path / "c.txt"
    corpus.write_text("w1 w2 w3\n", encoding="utf-8")
    train_files(other, [corpus], 2, tmp_path / "other.ngram", show_progress=False)
    with pytest.raises(UserError, match="another tokenizer"):
        make_drafter("ngram:" + str(tmp_path / "other.ngram"), verifier)


def test_missing_model_file_is_a_user_error(verifier, tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        make_drafter("ngram:" + str(tmp_path / "absent.ngram"), verifier)


def spec_for(template: str, models: dict[int, Path]) -> str:
    return template.format(**{f"o{order}": str(path) for order, path in models.items()})


def started(drafter, greedy: bool, seed: int = 0):
    config = SamplingConfig() if greedy else SamplingConfig(temperature=1.0)
    drafter.start([2], LogitsProcessor(config), torch.Generator().manual_seed(seed))
    return drafter


@pytest.mark.parametrize("spec", ["{o2}", "{o3}+context", "{o2}?backoff=none", "{o4}"])
def test_sampled_drafts_are_proper_distributions(verifier, models, spec):
    drafter = started(make_drafter("ngram:" + spec_for(spec, models), verifier), greedy=False)
    rng = random.Random(2)
    for _ in range(20):
        context = [2, *[rng.randrange(4, 64) for _ in range(rng.randint(1, 10))]]
        draft = drafter.propose(context, 4)
        assert len(draft) == 4
        assert draft.probs.shape == (4, verifier.vocab_size) and draft.probs.dtype == torch.float32
        assert torch.all(draft.probs >= 0)
        torch.testing.assert_close(draft.probs.sum(dim=1), torch.ones(4), atol=1e-5, rtol=0)
        for token, row in zip(draft.tokens, draft.probs, strict=True):
            assert row[token] > 0


@pytest.mark.slow
def test_sampled_tokens_follow_the_draft_rows(verifier, models):
    """Draws over many seeds match the row the drafter reports (chi-square)."""
    drafter = make_drafter("ngram:" + str(models[2]), verifier)
    context = [2, 10, 11, 12]
    draws, row = Counter(), None
    for seed in range(1500):
        draft = started(drafter, greedy=False, seed=seed).propose(context, 1)
        draws[draft.tokens[0]] += 1
        row = draft.probs[0] if row is None else row
        assert torch.equal(draft.probs[0], row)  # the distribution depends on the context only
    support = row.nonzero().flatten().tolist()
    assert set(draws) <= set(support)
    observed = np.array([draws[t] for t in support], dtype=float)
    expected = row[support].double().numpy() * observed.sum()
    assert stats.chisquare(observed, expected / expected.sum() * observed.sum()).pvalue > 1e-3


@pytest.mark.slow
def test_sampled_output_is_exact_with_the_ngram_drafter(verifier, models):
    check_sampling_is_exact(verifier, make_drafter("ngram:" + str(models[3]) + "+context", verifier), trials=500)


def test_unseen_context_without_backoff(verifier, models):
    """Greedy: the draft ends. Sampling: the study's uniform fallback."""
    spec = str(models[3]) + "?backoff=none"
    unseen = [2, 63, 63, 63, 62, 61]  # word salad never repeats these trigrams
    drafter = make_drafter("ngram:" + spec, verifier)
    assert drafter.model.context_node(unseen, backoff=False) is None
    assert len(started(drafter, greedy=True).propose(unseen, 3)) == 0
    draft = started(drafter, greedy=False).propose(unseen, 1)
    assert len(draft) == 1
    vocab = len(verifier.tokenizer)
    expected = torch.zeros(verifier.vocab_size)
    expected[:vocab] = 1 / vocab
    torch.testing.assert_close(draft.probs[0], expected)


def test_min_prob_ends_the_draft(verifier, models):
    drafter = started(make_drafter("ngram:" + str(models[2]) + "?min_prob=0.999", verifier), greedy=True)
    plain = started(make_drafter("ngram:" + str(models[2]), verifier), greedy=True)
    rng = random.Random(3)
    shorter = 0
    for _ in range(30):
        context = [2, *[rng.randrange(4, 64) for _ in range(3)]]
        capped, full = drafter.propose(context, 4), plain.propose(context, 4)
        assert capped.tokens == full.tokens[: len(capped)]
        shorter += len(capped) < len(full)
        # Every kept token had probability >= min_prob.
        window = list(context)
        for token in capped.tokens:
            assert plain.model.best(*plain.model.context_node(window))[1] >= 0.999
            window.append(token)
    assert shorter > 0


def test_context_cache_is_incremental(verifier, models):
    rng = random.Random(4)
    sequence = [rng.randrange(4, 12) for _ in range(200)]
    stepwise, whole = ContextCache(3), ContextCache(3)
    for end in range(1, len(sequence) + 1, 7):
        stepwise.sync(sequence[:end])
    stepwise.sync(sequence)
    whole.sync(sequence)
    assert stepwise.table == whole.table
    # Brute force: counts of what followed each context of 1-3 tokens.
    for length in (1, 2, 3):
        expected = Counter((tuple(sequence[i - length : i]), sequence[i]) for i in range(length, len(sequence)))
        for (context, token), count in expected.items():
            assert whole.table[context][3][token] == count


def test_context_cache_starts_over_on_a_new_sequence():
    cache = ContextCache(2)
    cache.sync([5, 6, 7])
    cache.sync([9, 9])
    assert cache.tokens == [9, 9] and set(cache.table) == {(9,)}


def test_live_context_is_preferred_when_it_matches_longer(verifier, models):
    """A repeated motif absent from the corpus is drafted from the context cache."""
    drafter = started(make_drafter("ngram:" + str(models[2]) + "+context", verifier), greedy=True)
    motif = [40, 41, 42, 43, 44]
    context = [2, *motif, 50, *motif[:2]]
    assert drafter.propose(context, 3).tokens == motif[2:5]


@pytest.mark.parametrize("spec", ["{o3}", "{o4}+context", "{o2}?backoff=none"])
def test_incremental_state_matches_a_fresh_drafter(verifier, models, spec):
    """Proposals along a growing sequence equal those of a drafter that starts from scratch."""
    drafter = started(make_drafter("ngram:" + spec_for(spec, models), verifier), greedy=True)
    rng = random.Random(5)
    sequence = [2, *[rng.randrange(4, 64) for _ in range(60)]]
    end = 2
    while end < len(sequence):
        fresh = started(make_drafter("ngram:" + spec_for(spec, models), verifier), greedy=True)
        assert drafter.propose(sequence[:end], 4).tokens == fresh.propose(sequence[:end], 4).tokens
        end += rng.randint(1, 5)  # accepted tokens plus the verifier's own


def test_min_prob_when_sampling_is_decided_before_drawing(verifier, models):
    """A row whose most likely token is below min_prob is never drafted from."""
    drafter = started(make_drafter("ngram:" + str(models[2]) + "?min_prob=0.5", verifier), greedy=False)
    rng = random.Random(6)
    lengths = []
    for _ in range(40):
        draft = drafter.propose([2, *[rng.randrange(4, 64) for _ in range(3)]], 4)
        lengths.append(len(draft))
        if len(draft):
            assert torch.all(draft.probs.max(dim=1).values >= 0.5 - 1e-6)
    assert min(lengths) < 4 and max(lengths) > 0
