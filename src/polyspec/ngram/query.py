"""Queries on a loaded n-gram model: which context matches, what follows it, how likely.

A context of length L is a node at depth L of the trie; its continuations are a token-sorted run
of depth L + 1, so finding a context is a walk of L binary searches. Back-off takes the longest
suffix of the context (at most order - 1 tokens) that has been seen with a continuation and uses
its maximum-likelihood distribution count(context, x) / count(context, *), unsmoothed; the empty
context (depth 0) is the unigram distribution. Without back-off only the full order - 1 token
context counts; an unseen one has no distribution here (the caller decides: uniform, or stop).

Drafting token after token reuses work: a *state* is the longest suffix of the text that is a
node, and appending a token moves it like an Aho-Corasick automaton, through the new token's
child or else through the suffix link (the node of the context minus its first token). Each
drafted token then costs about one binary search whatever the order. The most probable
continuation of every context and the suffix links are computed once at load time; the hot
path reads memoryviews, whose items are plain Python ints and floats (numpy scalars would cost
more than the search itself).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from polyspec.errors import UserError
from polyspec.ngram.storage import StoredModel
from polyspec.ngram.trie import parents_from_starts

ROOT = (0, 0)  # the empty context: depth 0, node 0


@dataclass(frozen=True)
class Candidate:
    token_id: int
    prob: float
    count: int
    order: int  # n-gram order used after back-off: matched context length + 1

    def to_dict(self) -> dict:
        return {"token_id": self.token_id, "prob": self.prob, "count": self.count, "order": self.order}


def best_continuations(starts: np.ndarray, tokens: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per context node: its most frequent continuation (ties: the smallest token id; -1 when it
    has none) and that continuation's probability."""
    num_nodes = len(starts) - 1
    best_token = np.full(num_nodes, -1, dtype=np.int32)
    best_prob = np.zeros(num_nodes, dtype=np.float64)  # exact against a min_prob threshold
    sizes = np.diff(starts.astype(np.int64))
    has = np.flatnonzero(sizes > 0)
    if len(has) == 0:
        return best_token, best_prob
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
    return best_token, best_prob


def suffix_links(stored: StoredModel, root_index: np.ndarray) -> list[np.ndarray]:
    """links[d][x]: the depth d - 1 node of context x (depth d) without its first token, for
    d = 1..order - 1 (depth 1 links to the root). The suffix of a stored n-gram is stored too,
    so every link exists; a miss means the file's levels disagree."""
    vocab = np.int64(stored.fingerprint.vocab_size)
    links = [np.zeros(0, np.uint32)]
    if stored.order >= 2:
        links.append(np.zeros(len(stored.tokens[0]), np.uint32))
    for depth in range(2, stored.order):
        tokens = stored.tokens[depth - 1].astype(np.int64)  # last token of each depth-d node
        if depth == 2:
            link = root_index[tokens]
            found = link >= 0
        else:
            # suffix(x) = child(suffix(parent(x)), last token of x), searched as sorted keys.
            parent_link = np.repeat(
                links[depth - 1].astype(np.int64), np.diff(stored.starts[depth - 2].astype(np.int64))
            )
            above = stored.tokens[depth - 2].astype(np.int64)
            keys = parents_from_starts(stored.starts[depth - 3]) * vocab + above
            wanted = parent_link * vocab + tokens
            link = np.minimum(np.searchsorted(keys, wanted), max(len(keys) - 1, 0))
            found = keys[link] == wanted if len(keys) else np.zeros(len(wanted), dtype=bool)
        if not found.all():
            raise UserError(f"n-gram model {str(stored.path)!r} is corrupt (a context's suffix is missing)")
        links.append(link.astype(np.uint32 if len(link) < 2**32 else np.int64))
    return links


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
        self._root_array = root_index
        # Memoryviews for the per-token Python path.
        self._root_index = memoryview(root_index)
        self._token_view = [memoryview(np.ascontiguousarray(t)) for t in self._tokens]
        self._starts_view = [memoryview(np.ascontiguousarray(s)) for s in self._starts]
        # Drafting tables, built by `state` on first use: inspecting a large model needs none.
        self._best_token: list[memoryview] = []
        self._best_prob: list[memoryview] = []
        self._links: list[memoryview] = []

    def prepare(self) -> None:
        """Build what drafting needs (best continuations, suffix links); idempotent."""
        if self._best_token:
            return
        tables = [
            best_continuations(self._starts[d], self._tokens[d + 1], self._counts[d + 1]) for d in range(self.order)
        ]
        self._links = [memoryview(link) for link in suffix_links(self.stored, self._root_array)]
        self._best_token = [memoryview(token) for token, _ in tables]
        self._best_prob = [memoryview(prob) for _, prob in tables]

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

    def state(self, sequence: Sequence[int]) -> tuple[int, int]:
        """(depth, node) of the longest suffix of `sequence` (at most order - 1 tokens) that is a
        node of the trie, continued or not. Drafting starts here: `step`, `predictor`, `best`
        and `greedy_draft` take states that this (or `step`) returned."""
        self.prepare()
        end = len(sequence)
        for depth in range(min(end, self.max_context), 0, -1):
            node = self._find(sequence, end - depth, end)
            if node >= 0:
                return depth, node
        return ROOT

    def step(self, depth: int, node: int, token: int) -> tuple[int, int]:
        """The state after appending `token` to a text in state (depth, node)."""
        if not 0 <= token < self.vocab_size:
            return ROOT
        while True:
            if depth < self.max_context:
                if depth == 0:
                    child = self._root_index[token]
                    return (1, child) if child >= 0 else ROOT
                starts = self._starts_view[depth]
                low, high = starts[node], starts[node + 1]
                tokens = self._token_view[depth + 1]
                child = bisect_left(tokens, token, low, high)
                if child < high and tokens[child] == token:
                    return depth + 1, child
            if depth == 0:
                return ROOT
            node = self._links[depth][node]
            depth -= 1

    def predictor(self, depth: int, node: int, backoff: bool = True) -> tuple[int, int] | None:
        """The context node whose distribution predicts the next token in state (depth, node):
        with back-off the longest suffix that has continuations, else the full order - 1 token
        context if it has any; None when there is none."""
        best_token = self._best_token
        if backoff:
            while depth and best_token[depth][node] < 0:
                node = self._links[depth][node]
                depth -= 1
        elif depth != self.max_context:
            return None
        return (depth, node) if best_token[depth][node] >= 0 else None

    def greedy_draft(self, depth: int, node: int, k: int, backoff: bool, min_prob: float, limit: int) -> list[int]:
        """Up to k most-probable tokens from state (depth, node): stops at an unseen context,
        a best token below min_prob, or a token id >= limit. One loop: this is the hot path."""
        best_token, best_prob, links = self._best_token, self._best_prob, self._links
        full, step = self.max_context, self.step
        drafted: list[int] = []
        for _ in range(k):
            d, x = depth, node
            if backoff:
                while d and best_token[d][x] < 0:
                    x = links[d][x]
                    d -= 1
            elif d != full:
                break
            token = best_token[d][x]
            if token < 0 or token >= limit or best_prob[d][x] < min_prob:
                break
            drafted.append(token)
            depth, node = step(depth, node, token)
        return drafted

    def context_node(self, sequence: Sequence[int], backoff: bool = True) -> tuple[int, int] | None:
        """(depth, node) of the context that predicts the token after `sequence`: the same as
        predictor(*state(sequence)), found by direct walks (no drafting tables needed)."""
        end = len(sequence)
        available = min(end, self.max_context)
        if backoff:
            depths = list(range(available, -1, -1))
        else:
            depths = [self.max_context] if available == self.max_context else []
        for depth in depths:
            node = self._find(sequence, end - depth, end) if depth else 0
            if node >= 0:
                starts = self._starts_view[depth]
                if starts[node] < starts[node + 1]:
                    return depth, node
        return None

    def best(self, depth: int, node: int) -> tuple[int, float]:
        """Most probable continuation of a context node and its probability."""
        if not self._best_token:
            self.prepare()
        return self._best_token[depth][node], self._best_prob[depth][node]

    def continuations(self, depth: int, node: int) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and counts of everything seen after a context node (token-sorted)."""
        low, high = int(self._starts[depth][node]), int(self._starts[depth][node + 1])
        return self._tokens[depth + 1][low:high], self._counts[depth + 1][low:high]

    def top(self, context: Sequence[int], k: int, backoff: bool = True) -> list[Candidate]:
        """The k most probable next tokens (ties: smaller id first); empty when, without
        back-off, the context was never seen (the study's drafter then falls back to uniform)."""
        found = self.context_node(list(context), backoff)
        if found is None or k <= 0:
            return []
        depth, node = found
        tokens, counts = self.continuations(depth, node)
        counts = counts.astype(np.int64)
        total = int(counts.sum())
        chosen = np.lexsort((tokens, -counts))[:k]
        return [
            Candidate(token_id=int(tokens[i]), prob=int(counts[i]) / total, count=int(counts[i]), order=depth + 1)
            for i in chosen
        ]
