"""N-gram counts as a trie of sorted arrays, one level per order (the kenlm / infini-gram shape).

Level n holds every distinct n-gram once, as (parent, token, count): `parent` is the index of its
(n-1)-token prefix in level n - 1 (0 for level 1, whose parent is the empty context) and `token`
its last token. Each level is sorted by (parent, token), which is the lexicographic order of the
n-grams, so the continuations of one context are a contiguous, token-sorted run of the next level.
Every prefix of a stored n-gram is stored too (a prefix occurs wherever the n-gram does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Level:
    parents: np.ndarray  # [m] int64, index into the previous level (sorted, non-decreasing)
    tokens: np.ndarray  # [m] uint32, last token of each n-gram (sorted within a parent)
    counts: np.ndarray  # [m] int64, occurrences

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class Trie:
    vocab_size: int
    levels: list[Level]  # levels[n - 1] holds the n-grams
    documents: int = 0
    num_tokens: int = 0
    min_count: int = 1

    @property
    def order(self) -> int:
        return len(self.levels)

    def ngram_counts(self) -> list[int]:
        return [len(level) for level in self.levels]

    def to_dict(self) -> dict[tuple[int, ...], int]:
        """Every n-gram with its count; for tests and small tries only."""
        result: dict[tuple[int, ...], int] = {}
        previous: list[tuple[int, ...]] = [()]
        for level in self.levels:
            grams = [(*previous[p], int(t)) for p, t in zip(level.parents.tolist(), level.tokens.tolist(), strict=True)]
            result.update(zip(grams, level.counts.tolist(), strict=True))
            previous = grams
        return result


def empty_trie(order: int, vocab_size: int) -> Trie:
    levels = [Level(np.zeros(0, np.int64), np.zeros(0, np.uint32), np.zeros(0, np.int64)) for _ in range(order)]
    return Trie(vocab_size=vocab_size, levels=levels)


def child_starts(parents: np.ndarray, num_parents: int) -> np.ndarray:
    """[num_parents + 1] offsets: the children of parent i are rows starts[i]:starts[i + 1]."""
    starts = np.zeros(num_parents + 1, dtype=np.int64)
    np.cumsum(np.bincount(parents, minlength=num_parents), out=starts[1:])
    return starts


def parents_from_starts(starts: np.ndarray) -> np.ndarray:
    """Inverse of `child_starts`."""
    return np.repeat(np.arange(len(starts) - 1, dtype=np.int64), np.diff(starts.astype(np.int64)))


def _group_sorted(keys: np.ndarray, counts: np.ndarray, order: np.ndarray | None):
    """keys sorted by `order` (or already sorted): returns unique keys, summed counts, and the
    group index of every input row."""
    sorted_keys = keys if order is None else keys[order]
    first = np.empty(len(sorted_keys), dtype=bool)
    if len(first):
        first[0] = True
        np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    group_of_sorted = np.cumsum(first) - 1
    sorted_counts = counts if order is None else counts[order]
    summed = np.add.reduceat(sorted_counts, starts) if len(starts) else sorted_counts[:0]
    if order is None:
        groups = group_of_sorted
    else:
        groups = np.empty_like(group_of_sorted)
        groups[order] = group_of_sorted
    return sorted_keys[starts], summed, groups


def merge(a: Trie, b: Trie) -> Trie:
    """Counts of both tries added together (same order and vocabulary)."""
    if a.order != b.order or a.vocab_size != b.vocab_size:
        raise ValueError("tries of different order or vocabulary cannot be merged")
    width = np.int64(a.vocab_size)
    map_a = np.zeros(1, dtype=np.int64)  # old index -> merged index in the previous level
    map_b = np.zeros(1, dtype=np.int64)
    levels = []
    for level_a, level_b in zip(a.levels, b.levels, strict=True):
        keys = np.concatenate(
            [map_a[level_a.parents] * width + level_a.tokens, map_b[level_b.parents] * width + level_b.tokens]
        )
        # Two sorted runs: the stable sort (timsort) merges them in linear time.
        order = np.argsort(keys, kind="stable")
        unique, counts, groups = _group_sorted(keys, np.concatenate([level_a.counts, level_b.counts]), order)
        levels.append(Level(unique // width, (unique % width).astype(np.uint32), counts))
        map_a, map_b = groups[: len(level_a)], groups[len(level_a) :]
    return Trie(
        vocab_size=a.vocab_size,
        levels=levels,
        documents=a.documents + b.documents,
        num_tokens=a.num_tokens + b.num_tokens,
        min_count=max(a.min_count, b.min_count),
    )


def scaled(trie: Trie, weight: int) -> Trie:
    """The same n-grams, each count `weight` times."""
    if weight == 1:
        return trie
    levels = [Level(level.parents, level.tokens, level.counts * weight) for level in trie.levels]
    return Trie(trie.vocab_size, levels, trie.documents, trie.num_tokens, trie.min_count)


def prune(trie: Trie, min_count: int) -> Trie:
    """Drop n-grams of order >= 2 seen fewer than min_count times (unigrams are all kept, so
    every token keeps its unigram count). A pruned n-gram's extensions are pruned with it."""
    if min_count <= 1:
        return trie
    levels = [trie.levels[0]]
    kept_before = np.ones(len(trie.levels[0]), dtype=bool)
    new_index = np.arange(len(trie.levels[0]), dtype=np.int64)
    for level in trie.levels[1:]:
        keep = (level.counts >= min_count) & kept_before[level.parents]
        levels.append(Level(new_index[level.parents[keep]], level.tokens[keep], level.counts[keep]))
        kept_before = keep
        new_index = np.cumsum(keep) - 1
    return Trie(
        vocab_size=trie.vocab_size,
        levels=levels,
        documents=trie.documents,
        num_tokens=trie.num_tokens,
        min_count=max(trie.min_count, min_count),
    )
