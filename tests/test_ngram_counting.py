"""N-gram counting against a brute-force Counter, for every order, in one chunk and streamed."""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np
import pytest

from polyspec.ngram import MAX_ORDER
from polyspec.ngram.counting import ChunkMerger, _distinct, count_chunk, count_rows
from polyspec.ngram.trie import merge, prune


def random_documents(seed: int, vocab: int, count: int = 40, max_length: int = 25) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    # Few distinct tokens in a small alphabet make repeated n-grams, as in real text.
    alphabet = rng.choice(vocab, size=min(vocab, 9), replace=False)
    return [rng.choice(alphabet, size=rng.integers(0, max_length)).tolist() for _ in range(count)]


def brute_force(documents: list[list[int]], order: int) -> Counter:
    counts: Counter = Counter()
    for document in documents:
        for n in range(1, order + 1):
            for i in range(len(document) - n + 1):
                counts[tuple(document[i : i + n])] += 1
    return counts


def as_arrays(documents: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.array([t for d in documents for t in d], dtype=np.uint32)
    return tokens, np.array([len(d) for d in documents], dtype=np.int64)


def count_streamed(documents, order, vocab, chunk_documents):
    merger = ChunkMerger(order, vocab)
    for i in range(0, len(documents), chunk_documents):
        merger.add(count_chunk(*as_arrays(documents[i : i + chunk_documents]), order, vocab))
    return merger.result()


@pytest.mark.parametrize("order", range(1, MAX_ORDER + 1))
@pytest.mark.parametrize(("vocab", "key_bits"), [(12, 63), (262_144, 63), (262_144, 12)])
def test_counts_equal_brute_force(order, vocab, key_bits):
    """A narrow key width forces the argsort path that keys too wide to pack take."""
    for seed in range(3):
        documents = random_documents(seed, vocab)
        expected = brute_force(documents, order)
        trie = count_chunk(*as_arrays(documents), order, vocab, key_bits=key_bits)
        assert trie.to_dict() == dict(expected)
        assert trie.num_tokens == sum(map(len, documents))
        assert trie.documents == sum(1 for d in documents if d)


@pytest.mark.parametrize("order", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("chunk_documents", [1, 3, 7])
def test_streamed_chunks_merge_to_the_same_counts(order, chunk_documents):
    documents = random_documents(11, 50, count=30)
    streamed = count_streamed(documents, order, 50, chunk_documents)
    assert streamed.to_dict() == dict(brute_force(documents, order))
    assert streamed.num_tokens == sum(map(len, documents))


def rows_of(documents: list[list[int]], order: int) -> np.ndarray:
    """One row per position: the order - 1 tokens before it (-1 before the start) and it."""
    rows = [([-1] * (order - 1) + d)[i : i + order] for d in documents for i in range(len(d))]
    return np.array(rows, dtype=np.int64).reshape(-1, order)


@pytest.mark.parametrize("order", [1, 2, 4, 6])
def test_rows_of_a_text_count_as_the_text_does(order):
    documents = random_documents(3, 40, count=30)
    rows = rows_of(documents, order)
    trie = count_rows(rows, np.ones(len(rows), dtype=np.int64), 40)
    expected = count_chunk(*as_arrays(documents), order, 40)
    assert trie.to_dict() == expected.to_dict()
    for ours, theirs in zip(trie.levels, expected.levels, strict=True):  # the same layout, too
        assert np.array_equal(ours.parents, theirs.parents) and np.array_equal(ours.tokens, theirs.tokens)


def test_weighted_rows_sum_their_weights_at_every_order():
    rng = np.random.default_rng(0)
    documents = random_documents(8, 30, count=20)
    text = rows_of(documents, 3)
    # Extra rows end in other tokens after the text's own contexts, as candidates do.
    extra = text.copy()
    extra[:, -1] = rng.integers(0, 30, size=len(extra))
    rows = np.concatenate([text, extra])
    weights = rng.integers(1, 9, size=len(rows))
    expected: Counter = Counter()
    for row, weight in zip(rows.tolist(), weights.tolist(), strict=True):
        for n in range(1, 4):
            if row[3 - n] >= 0:
                expected[tuple(row[3 - n :])] += weight
    assert count_rows(rows, weights, 30).to_dict() == dict(expected)


def test_a_row_whose_prefix_ends_no_row_is_rejected():
    with pytest.raises(ValueError, match="prefix"):
        count_rows(np.array([[3, 4]]), np.array([1]), 10)  # (3,) ends no row


def test_ngrams_never_span_documents():
    documents = [[1, 2], [3, 4]]
    counts = count_chunk(*as_arrays(documents), 3, 5).to_dict()
    assert (2, 3) not in counts
    assert not any(len(gram) == 3 for gram in counts)


def test_levels_are_sorted_lexicographically():
    documents = random_documents(5, 30, count=60)
    trie = count_chunk(*as_arrays(documents), 4, 30)
    for level in trie.levels:
        keys = level.parents * 30 + level.tokens.astype(np.int64)
        assert np.all(np.diff(keys) > 0)


def test_merge_adds_counts():
    a, b = random_documents(1, 20), random_documents(2, 20)
    merged = merge(count_chunk(*as_arrays(a), 3, 20), count_chunk(*as_arrays(b), 3, 20))
    assert merged.to_dict() == dict(brute_force(a, 3) + brute_force(b, 3))
    assert merged.documents == sum(1 for d in a + b if d)


def test_prune_keeps_unigrams_and_frequent_ngrams():
    documents = random_documents(3, 15, count=80)
    expected = {g: c for g, c in brute_force(documents, 3).items() if len(g) == 1 or c >= 3}
    pruned = prune(count_chunk(*as_arrays(documents), 3, 15), 3)
    assert pruned.to_dict() == expected
    assert pruned.min_count == 3


def test_packed_and_argsort_paths_agree():
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 1000, size=5000).astype(np.int64)
    packed = _distinct(keys, 1000)
    fallback = _distinct(keys, 1 << 62)  # too wide to pack with positions
    for left, right in zip(packed, fallback, strict=True):
        np.testing.assert_array_equal(left, right)
    unique, counts, groups = packed
    np.testing.assert_array_equal(unique[groups], keys)
    assert counts.sum() == len(keys)


def test_token_outside_vocabulary_is_rejected():
    with pytest.raises(ValueError):
        count_chunk(np.array([1, 7], dtype=np.uint32), np.array([2]), 2, 5)


# Training from objects: a tokenizer object and an iterable of strings.

WORD_DOCUMENTS = ["w1 w2 w3 w4", "", "w1 w2 w3 w5", "w1 w2 w5", "w2 w3 w4 w4 w4", "w7"]


def word_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_train_from_strings_equals_brute_force(tmp_path, tokenizer, monkeypatch):
    from polyspec.ngram import load
    from polyspec.ngram.train import train

    monkeypatch.setattr(sys.modules["polyspec.ngram.train"], "BATCH_DOCUMENTS", 2)  # several batches, one empty
    documents = WORD_DOCUMENTS + ["", ""] + WORD_DOCUMENTS
    out = tmp_path / "m.ngram"
    report = train(tokenizer, iter(documents), 3, out, show_progress=False, chunk_tokens=7, metadata={"run": "x"})
    expected = brute_force([word_ids(tokenizer, d) for d in documents], 3)
    model = load(out)
    assert model.stored.to_trie().to_dict() == dict(expected)
    assert report.documents == model.stored.documents == sum(1 for d in documents if d)
    assert report.tokens == sum(len(word_ids(tokenizer, d)) for d in documents)
    assert model.metadata == report.metadata and model.metadata["run"] == "x"


def test_text_hash_fingerprints_the_documents(tmp_path, tokenizer):
    from polyspec.ngram.train import train

    def text_hash(documents) -> str:
        return train(tokenizer, documents, order=2, out=tmp_path / "m.ngram", show_progress=False).metadata[
            "text_sha256"
        ]

    same = text_hash(WORD_DOCUMENTS)
    assert text_hash(list(WORD_DOCUMENTS)) == same
    assert text_hash(WORD_DOCUMENTS[:-1]) != same
    assert text_hash(["w1 w2", "w3"]) != text_hash(["w1", "w2 w3"])


def test_train_wants_objects(tmp_path, tokenizer):
    from polyspec.ngram.train import train

    with pytest.raises(TypeError, match="tokenizer object"):
        train("gemma3-270m", WORD_DOCUMENTS, 2, tmp_path / "m.ngram", show_progress=False)
    with pytest.raises(TypeError, match="not one string"):
        train(tokenizer, "w1 w2 w3", 2, tmp_path / "m.ngram", show_progress=False)
    with pytest.raises(TypeError, match="train_files"):
        train(tokenizer, [tmp_path / "corpus.txt"], 2, tmp_path / "m.ngram", show_progress=False)
    assert not (tmp_path / "m.ngram").exists()


def test_train_files_records_the_corpus(tmp_path, tokenizer):
    import hashlib

    from polyspec.ngram import load
    from polyspec.ngram.train import train_files

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(WORD_DOCUMENTS) + "\n")
    out = tmp_path / "m.ngram"
    train_files(tokenizer, [corpus], 2, out, show_progress=False, metadata={"tokenizer": "words"})
    metadata = load(out).metadata
    assert metadata["corpus"] == [
        {"file": str(corpus), "bytes": corpus.stat().st_size, "sha256": hashlib.sha256(corpus.read_bytes()).hexdigest()}
    ]
    assert metadata["tokenizer"] == "words" and metadata["record_format"] == {"text_field": "text", "column": "0"}
