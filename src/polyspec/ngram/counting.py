"""Vectorised n-gram counting of one chunk of documents, and merging chunk counts as they stream.

Within a chunk, order n is counted from order n - 1: the n-gram starting at position i is the
pair (rank of the (n-1)-gram at i, rank of the token at i + n - 1), packed into one int64 key
whose order is the lexicographic order of the n-grams. One sort per order then gives the
distinct n-grams, their counts and the parent index the trie needs. While the key and the
position fit in 63 bits together, they are sorted as one packed value: a plain sort is about
twice as fast as the argsort that recovering each position's rank would otherwise need.
"""

from __future__ import annotations

import numpy as np

from polyspec.ngram.trie import Level, Trie, empty_trie, merge

CHUNK_TOKENS = 1 << 22  # 4M positions: packed key + position stay within 63 bits


def _bits(bound: int) -> int:
    """Bits needed for values in [0, bound)."""
    return max(1, int(bound - 1).bit_length())


def _runs(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start flags, distinct keys and run lengths of a sorted array."""
    first = np.empty(len(sorted_keys), dtype=bool)
    first[0] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    lengths = np.diff(np.append(starts, len(sorted_keys)))
    return first, sorted_keys[starts], lengths


def _distinct(keys: np.ndarray, key_bound: int, key_bits: int = 63) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct keys, their counts, and the distinct-key index of every input key."""
    position_bits = _bits(len(keys))
    if _bits(key_bound) + position_bits <= key_bits:
        packed = (keys << position_bits) | np.arange(len(keys), dtype=np.int64)
        packed.sort()
        sorted_keys = packed >> position_bits
        positions = packed & ((1 << position_bits) - 1)
    else:
        positions = np.argsort(keys)
        sorted_keys = keys[positions]
    _, unique, counts = _runs(sorted_keys)
    groups = np.empty(len(keys), dtype=np.int64)
    groups[positions] = np.repeat(np.arange(len(unique), dtype=np.int64), counts)
    return unique, counts, groups


def count_chunk(tokens: np.ndarray, lengths: np.ndarray, order: int, vocab_size: int, key_bits: int = 63) -> Trie:
    """tokens: [n] uint32, the documents one after another; lengths: [d] tokens per document.
    Returns the counts of every n-gram of order 1..order lying inside one document.
    (A key_bits below 63 only serves to test the argsort path that very wide keys take.)"""
    tokens = np.asarray(tokens, dtype=np.uint32)
    lengths = np.asarray(lengths, dtype=np.int64)
    size = len(tokens)
    trie = empty_trie(order, vocab_size)
    trie.documents = int(np.count_nonzero(lengths))
    trie.num_tokens = size
    if size == 0:
        return trie
    if int(tokens.max()) >= vocab_size:
        raise ValueError(f"token id {int(tokens.max())} is outside the vocabulary of {vocab_size}")
    # remaining[i]: tokens from i to the end of its document; an n-gram starts where it is >= n.
    remaining = np.repeat(np.cumsum(lengths), lengths) - np.arange(size, dtype=np.int64)

    histogram = np.bincount(tokens, minlength=vocab_size)
    present = np.flatnonzero(histogram)
    token_rank = np.cumsum(histogram > 0) - 1
    ranks = token_rank[tokens]  # [n] rank of each token among the chunk's distinct tokens
    width = len(present)
    trie.levels[0] = Level(np.zeros(width, np.int64), present.astype(np.uint32), histogram[present])

    previous_ranks, previous_count = ranks, width
    for n in range(2, order + 1):
        starts = np.flatnonzero(remaining >= n)
        if len(starts) == 0:
            break
        keys = previous_ranks[starts] * width + ranks[starts + (n - 1)]
        if n == order:
            keys.sort()
            _, unique, counts = _runs(keys)
        else:
            unique, counts, groups = _distinct(keys, previous_count * width, key_bits)
            previous_ranks = np.zeros(size, dtype=np.int64)
            previous_ranks[starts] = groups
            previous_count = len(unique)
        trie.levels[n - 1] = Level(unique // width, present[unique % width].astype(np.uint32), counts)
    return trie


class ChunkMerger:
    """Adds chunk counts as they arrive, merging like a binary counter: a merged trie is merged
    again only with one built from as many chunks, so each count is merged O(log chunks) times
    and memory stays near the size of the final counts."""

    def __init__(self, order: int, vocab_size: int) -> None:
        self.order, self.vocab_size = order, vocab_size
        self._stack: list[tuple[int, Trie]] = []  # (chunks merged into it, trie)

    def add(self, trie: Trie) -> None:
        weight = 1
        while self._stack and self._stack[-1][0] <= weight:
            below_weight, below = self._stack.pop()
            trie = merge(below, trie)
            weight += below_weight
        self._stack.append((weight, trie))

    def result(self) -> Trie:
        if not self._stack:
            return empty_trie(self.order, self.vocab_size)
        total = self._stack[0][1]
        for _, trie in self._stack[1:]:
            total = merge(total, trie)
        self._stack = [(1, total)]
        return total


def count_rows(rows: np.ndarray, weights: np.ndarray, vocab_size: int) -> Trie:
    """Weighted n-grams given as rows: rows [m, order] int64, the tokens before an n-gram's
    last token and then that token, -1 where the text had not started yet; level n sums the
    weights of the last n tokens of every row that holds n tokens. Every (n-1)-token prefix of
    a counted n-gram must itself end some row (the text's own n-grams do), else ValueError.

    Whole n-grams as rows let a count be a fraction of an occurrence: the verifier's
    probabilities of its candidates at one position, scaled to integers."""
    rows = np.asarray(rows, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.int64)
    order = rows.shape[1]
    trie = empty_trie(order, vocab_size)
    if len(rows) and int(rows.max()) >= vocab_size:
        raise ValueError(f"token id {int(rows.max())} is outside the vocabulary of {vocab_size}")
    previous = np.zeros((1, 0), dtype=np.int64)
    for n in range(1, order + 1):
        held = rows[:, order - n] >= 0
        grams, inverse = np.unique(rows[held, order - n :], axis=0, return_inverse=True)
        counts = np.bincount(inverse.reshape(-1), weights=weights[held], minlength=len(grams)).round().astype(np.int64)
        if n == 1:
            parents = np.zeros(len(grams), dtype=np.int64)
        else:
            # Both sorted lexicographically: each prefix's index among the known (n-1)-grams.
            known, where = np.unique(np.concatenate([previous, grams[:, :-1]]), axis=0, return_inverse=True)
            if len(known) != len(previous):
                raise ValueError(f"an {n}-gram's prefix ends no row")
            parents = where.reshape(-1)[len(previous) :]
        trie.levels[n - 1] = Level(parents, grams[:, -1].astype(np.uint32), counts)
        previous = grams
    return trie
