"""Queries on a loaded n-gram model: which context matches, what follows it, how likely.

A context of length L is a node at depth L of the trie; its continuations are a token-sorted run
of depth L + 1, so finding a context is a walk of L binary searches. Back-off takes the longest
suffix of the context (at most order - 1 tokens) that has been seen with a continuation and uses
its maximum-likelihood distribution count(context, x) / count(context, *), unsmoothed; the empty
context (depth 0) is the unigram distribution. Without back-off only the full order - 1 token
context counts; an unseen one has no distribution here (the caller decides: uniform, or stop).

The most probable continuation of every context is computed once at load time, so a greedy
draft step costs one walk and two array reads. The hot path reads memoryviews, whose items are
plain Python ints and floats (numpy scalars would cost more than the search itself).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from polyspec.ngram.storage import StoredModel


@dataclass(frozen=True)
class Candidate:
    token_id: int
    prob: float
    count: int
    order: int  # n-gram order used after back-off: matched context length + 1

    def to_dict(self) -> dict:
        return {"token_id": self.token_id, "prob": self.prob, "count": self.count, "order": self.order}


def best_continuations(
    starts: np.ndarray, tokens: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per context node: its most frequent continuation (ties: the smallest token id; -1 when it
    has none), that continuation's probability, and the total count of its continuations."""
    num_nodes = len(starts) - 1
    best_token = np.full(num_nodes, -1, dtype=np.int64)
    best_prob = np.zeros(num_nodes, dtype=np.float64)
    totals = np.zeros(num_nodes, dtype=np.int64)
    sizes = np.diff(starts.astype(np.int64))
    has = np.flatnonzero(sizes > 0)
    if len(has) == 0:
        return best_token, best_prob, totals
    counts = counts.astype(np.int64)
    segment_starts = starts[:-1][has].astype(np.int64)
    # Nodes without continuations are skipped, so consecutive segment starts bound each segment.
    segment_max = np.maximum.reduceat(counts, segment_starts)
    segment_total = np.add.reduceat(counts, segment_starts)
    segment_of = np.repeat(np.arange(len(has)), sizes[has])
    maxima = np.flatnonzero(counts == segment_max[segment_of])
    first = np.ones(len(maxima), dtype=bool)
    first[1:] = segment_of[maxima[1:]] != segment_of[maxima[:-1]]
    best_token[has] = tokens[maxima[first]]
    best_prob[has] = segment_max / segment_total
    totals[has] = segment_total
    return best_token, best_prob, totals


class NGramModel:
    def __init__(self, stored: StoredModel) -> None:
        self.stored = stored
        self.order = stored.order
        self.vocab_size = stored.fingerprint.vocab_size
        self.max_context = stored.order - 1
        # Index by depth: tokens[d], counts[d] for d = 1..order; starts[d] for d = 0..order - 1
        # gives the continuations of depth-d nodes in depth d + 1.
        self._tokens: list[np.ndarray] = [np.zeros(0, np.uint32), *stored.tokens]
        self._counts: list[np.ndarray] = [np.zeros(0, np.uint32), *stored.counts]
        root_starts = np.array([0, len(stored.tokens[0])], dtype=np.int64)
        self._starts: list[np.ndarray] = [root_starts, *stored.starts]
        root_index = np.full(self.vocab_size, -1, dtype=np.int64)
        root_index[stored.tokens[0]] = np.arange(len(stored.tokens[0]))
        best = [
            best_continuations(self._starts[d], self._tokens[d + 1], self._counts[d + 1]) for d in range(self.order)
        ]
        self._totals = [totals for _, _, totals in best]
        # Memoryviews for the per-token Python path.
        self._root_index = memoryview(root_index)
        self._token_view = [memoryview(np.ascontiguousarray(t)) for t in self._tokens]
        self._starts_view = [memoryview(np.ascontiguousarray(s)) for s in self._starts]
        self._best_token = [memoryview(token) for token, _, _ in best]
        self._best_prob = [memoryview(prob) for _, prob, _ in best]

    def _find(self, sequence: Sequence[int], start: int, end: int) -> int:
        """Node of sequence[start:end] (a non-empty context) at depth end - start, or -1."""
        token = sequence[start]
        if not 0 <= token < self.vocab_size:
            return -1
        node = self._root_index[token]
        depth = 1
        for position in range(start + 1, end):
            if node < 0:
                return -1
            starts = self._starts_view[depth]
            low, high = starts[node], starts[node + 1]
            tokens = self._token_view[depth + 1]
            token = sequence[position]
            node = bisect_left(tokens, token, low, high)
            if node == high or tokens[node] != token:
                return -1
            depth += 1
        return node

    def context_node(self, sequence: Sequence[int], backoff: bool = True) -> tuple[int, int] | None:
        """(depth, node) of the context whose distribution predicts the token after `sequence`:
        the longest suffix seen with a continuation when backing off, else the full order - 1
        token suffix or None when it was not seen."""
        available = min(len(sequence), self.max_context)
        end = len(sequence)
        if not backoff:
            if available < self.max_context:
                return None
            if self.max_context == 0:
                return (0, 0) if self._best_token[0][0] >= 0 else None
            node = self._find(sequence, end - available, end)
            return (available, node) if node >= 0 and self._best_token[available][node] >= 0 else None
        for depth in range(available, 0, -1):
            node = self._find(sequence, end - depth, end)
            if node >= 0 and self._best_token[depth][node] >= 0:
                return depth, node
        return (0, 0) if self._best_token[0][0] >= 0 else None

    def best(self, depth: int, node: int) -> tuple[int, float]:
        """Most probable continuation of a context node and its probability."""
        return self._best_token[depth][node], self._best_prob[depth][node]

    def continuations(self, depth: int, node: int) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and counts of everything seen after a context node (token-sorted)."""
        low, high = int(self._starts[depth][node]), int(self._starts[depth][node + 1])
        return self._tokens[depth + 1][low:high], self._counts[depth + 1][low:high]

    def total(self, depth: int, node: int) -> int:
        return int(self._totals[depth][node])

    def top(self, context: Sequence[int], k: int, backoff: bool = True) -> list[Candidate]:
        """The k most probable next tokens (ties: smaller id first); empty when, without
        back-off, the context was never seen (the study's drafter then falls back to uniform)."""
        found = self.context_node(list(context), backoff)
        if found is None or k <= 0:
            return []
        depth, node = found
        tokens, counts = self.continuations(depth, node)
        total = self.total(depth, node)
        counts = counts.astype(np.int64)
        chosen = np.lexsort((tokens, -counts))[:k]
        return [
            Candidate(token_id=int(tokens[i]), prob=int(counts[i]) / total, count=int(counts[i]), order=depth + 1)
            for i in chosen
        ]
