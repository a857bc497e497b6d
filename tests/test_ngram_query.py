"""Back-off rules and next-token distributions of a loaded model, by hand and against brute force."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pytest

from polyspec.errors import UserError
from polyspec.ngram import load
from polyspec.ngram.counting import count_chunk
from polyspec.ngram.query import NGramModel
from polyspec.ngram.storage import save
from polyspec.vocabulary import Fingerprint

DOCUMENTS = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 5], [2, 3, 4], [6], [7, 6]]


def build(tmp_path, documents, order, vocab=10) -> NGramModel:
    tokens = np.array([t for d in documents for t in d], dtype=np.uint32)
    lengths = np.array([len(d) for d in documents])
    path = tmp_path / f"o{order}.ngram"
    save(count_chunk(tokens, lengths, order, vocab), Fingerprint(vocab, "0" * 64), path)
    return load(path)


def summary(candidates):
    return [(c.token_id, round(c.prob, 9), c.count, c.order) for c in candidates]


def test_full_context_seen(tmp_path):
    model = build(tmp_path, DOCUMENTS, 3)
    assert summary(model.top([1, 2], 5)) == [(3, round(2 / 3, 9), 2, 3), (5, round(1 / 3, 9), 1, 3)]


def test_backs_off_to_the_longest_seen_suffix(tmp_path):
    model = build(tmp_path, DOCUMENTS, 3)
    # (9, 2) was never seen; (2,) was, followed by 3 three times and by 5 once.
    assert summary(model.top([9, 2], 5)) == [(3, 0.75, 3, 2), (5, 0.25, 1, 2)]
    # Only the last order - 1 tokens matter.
    assert summary(model.top([4, 4, 4, 1, 2], 1)) == [(3, round(2 / 3, 9), 2, 3)]


def test_context_without_continuation_backs_off_to_unigrams(tmp_path):
    model = build(tmp_path, DOCUMENTS, 3)
    # 6 occurs only at the ends of documents: it has no continuation, so neither (3, 6) nor (6,) predicts.
    top = model.top([3, 6], 3)
    assert [c.order for c in top] == [1, 1, 1]
    assert summary(top)[0] == (2, round(4 / 17, 9), 4, 1)
    # Ties go to the smaller id: 1 and 3 both occur three times.
    assert [c.token_id for c in top] == [2, 1, 3]


def test_no_backoff_only_uses_the_full_context(tmp_path):
    model = build(tmp_path, DOCUMENTS, 3)
    assert model.top([9, 2], 5, backoff=False) == []
    assert model.top([2], 5, backoff=False) == []  # shorter than order - 1
    assert summary(model.top([1, 2], 5, backoff=False)) == summary(model.top([1, 2], 5))


def test_bigram_without_backoff_is_the_maximum_likelihood_estimate(tmp_path):
    model = build(tmp_path, DOCUMENTS, 2)
    pairs = Counter((a, b) for d in DOCUMENTS for a, b in zip(d, d[1:], strict=False))
    for a in range(10):
        after_a = {b: c for (x, b), c in pairs.items() if x == a}
        candidates = model.top([a], 10, backoff=False)
        assert {c.token_id: c.prob for c in candidates} == pytest.approx(
            {b: c / sum(after_a.values()) for b, c in after_a.items()}
        )
        assert all(c.order == 2 for c in candidates)


def test_unigram_model(tmp_path):
    model = build(tmp_path, DOCUMENTS, 1)
    assert summary(model.top([5, 5], 1)) == [(2, round(4 / 17, 9), 4, 1)]
    assert model.top([5], 1, backoff=False)[0].token_id == 2


def test_context_node_and_best(tmp_path):
    model = build(tmp_path, DOCUMENTS, 3)
    depth, node = model.context_node([1, 2])
    assert depth == 2
    assert model.best(depth, node) == (3, pytest.approx(2 / 3))
    tokens, counts = model.continuations(depth, node)
    assert tokens.tolist() == [3, 5] and counts.tolist() == [2, 1]
    assert model.context_node([8]) == (0, 0)  # unknown token: the empty context
    assert model.context_node([10_000, 2])[0] == 1  # ids beyond the vocabulary are never found


def brute_force_top(documents, order, context, k):
    counts: dict[tuple, Counter] = defaultdict(Counter)
    for d in documents:
        for n in range(1, order + 1):
            for i in range(len(d) - n + 1):
                counts[tuple(d[i : i + n - 1])][d[i + n - 1]] += 1
    for length in range(min(order - 1, len(context)), -1, -1):
        following = counts.get(tuple(context[len(context) - length :]))
        if following:
            total = sum(following.values())
            ranked = sorted(following.items(), key=lambda item: (-item[1], item[0]))[:k]
            return [(t, round(c / total, 9), c, length + 1) for t, c in ranked]
    return []


@pytest.mark.parametrize("order", [2, 3, 4, 6])
def test_top_matches_brute_force(tmp_path, order):
    rng = np.random.default_rng(order)
    documents = [rng.integers(0, 6, size=rng.integers(1, 15)).tolist() for _ in range(40)]
    model = build(tmp_path, documents, order, vocab=8)
    for _ in range(60):
        context = rng.integers(0, 8, size=rng.integers(0, 7)).tolist()
        assert summary(model.top(context, 4)) == brute_force_top(documents, order, context, 4)
        found = model.context_node(context)
        expected = brute_force_top(documents, order, context, 1)
        assert model.best(*found)[0] == expected[0][0]


@pytest.mark.parametrize("order", [1, 2, 3, 5])
def test_stepping_token_by_token_equals_matching_from_scratch(tmp_path, order):
    rng = np.random.default_rng(10 + order)
    documents = [rng.integers(0, 5, size=rng.integers(1, 20)).tolist() for _ in range(30)]
    model = build(tmp_path, documents, order, vocab=7)
    sequence = rng.integers(0, 7, size=300).tolist()  # 5 and 6 never occur: forces resets
    state = model.state([])
    for end in range(1, len(sequence) + 1):
        state = model.step(*state, sequence[end - 1])
        assert state == model.state(sequence[:end])
        for backoff in (True, False):
            assert model.predictor(*state, backoff=backoff) == model.context_node(sequence[:end], backoff)


@pytest.mark.parametrize("backoff", [True, False])
def test_greedy_draft_follows_the_best_continuations(tmp_path, backoff):
    rng = np.random.default_rng(3)
    documents = [rng.integers(0, 6, size=rng.integers(1, 20)).tolist() for _ in range(40)]
    model = build(tmp_path, documents, 4, vocab=8)
    for _ in range(50):
        context = rng.integers(0, 8, size=rng.integers(1, 6)).tolist()
        drafted = model.greedy_draft(*model.state(context), 5, backoff, 0.0, 8)
        expected, window = [], list(context)
        for _ in range(5):
            found = model.context_node(window, backoff)
            if found is None:
                break
            expected.append(model.best(*found)[0])
            window.append(expected[-1])
        assert drafted == expected


def test_missing_suffix_is_reported_as_corruption(tmp_path):
    """A file with a valid header whose 3-token context (1, 2, 3) lacks the suffix (2, 3): found
    when drafting first needs that suffix link."""
    from polyspec.ngram.trie import Level, Trie

    def level(parents, tokens):
        return Level(np.array(parents, np.int64), np.array(tokens, np.uint32), np.ones(len(tokens), np.int64))

    levels = [level([0, 0, 0, 0], [1, 2, 3, 4]), level([0], [2]), level([0], [3]), level([0], [4])]
    path = tmp_path / "broken.ngram"
    save(Trie(vocab_size=5, levels=levels), Fingerprint(5, "0" * 64), path)
    model = load(path)
    assert model.top([1, 2, 3], 1)[0].token_id == 4  # inspection needs no suffix links
    state = model.state([1, 2, 3])
    with pytest.raises(UserError, match="suffix is missing"):
        model.greedy_draft(*state, 2, True, 0.0, 5)


def brute_force_best(documents, context):
    following = Counter(d[i + len(context)] for d in documents for i in range(len(d) - len(context))
                        if d[i : i + len(context)] == list(context))  # fmt: skip
    if not following:
        return -1, 0.0
    token = min(following, key=lambda t: (-following[t], t))
    return token, following[token] / sum(following.values())


def test_drafting_tables_are_filled_only_where_drafting_goes(tmp_path):
    """prepare() computes nothing; each node's best continuation is computed when first asked
    for, equal to brute force, and kept (a second ask finds it in the table)."""
    rng = np.random.default_rng(7)
    documents = [rng.integers(0, 6, size=rng.integers(1, 30)).tolist() for _ in range(60)]
    documents.append([7] * 30)  # 7 is followed only by itself
    model = build(tmp_path, documents, 3, vocab=9)
    model.prepare()
    assert all(not any(table) for table in model._best)
    contexts = [[a] for a in range(9)] + [[a, b] for a in range(9) for b in range(9)] + [[]]
    for context in contexts:
        found = model._find(context, 0, len(context)) if context else 0
        if found < 0:
            continue
        depth = len(context)
        token, prob = model.best(depth, found)
        assert model._best[depth][found] == token + 2  # kept
        expected_token, expected_prob = brute_force_best(documents, context)
        assert token == expected_token and prob == expected_prob


def test_first_maximum_wins_in_long_runs(tmp_path):
    """More than 64 continuations (the numpy path): ties still go to the smallest token id."""
    documents = [[0, t] for t in range(1, 200)] + [[0, 150], [0, 120]]
    model = build(tmp_path, documents, 2, vocab=200)
    assert model.best(1, model.state([0])[1]) == (120, pytest.approx(2 / 201))
    model = build(tmp_path, documents[:-2] + [[0, 150], [0, 150]], 2, vocab=200)
    assert model.best(1, model.state([0])[1]) == (150, pytest.approx(3 / 201))


def test_model_on_the_mapped_file(tmp_path):
    model = build(tmp_path, DOCUMENTS, 3)
    assert model.fingerprint == Fingerprint(10, "0" * 64) and model.metadata == {}
    assert isinstance(model, NGramModel)
    assert all(not array.flags.owndata for array in model.stored.tokens)
