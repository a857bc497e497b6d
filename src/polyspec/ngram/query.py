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
continuation of a context and its suffix link are computed the first time drafting reaches it
and kept in zero-initialised tables, so opening a model costs nothing per n-gram. The hot path
reads memoryviews (over the memory-mapped file), whose items are plain Python ints and floats
(numpy scalars would cost more than the search itself).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from polyspec.errors import UserError
from polyspec.ngram.storage import StoredModel

ROOT = (0, 0)  # the empty context: depth 0, node 0


@dataclass(frozen=True)
class Candidate:
    token_id: int
    prob: float
    count: int
    order: int  # n-gram order used after back-off: matched context length + 1

    def to_dict(self) -> dict:
        return {"token_id": self.token_id, "prob": self.prob, "count": self.count, "order": self.order}


class NGramModel:
    """A model file's counts, ready for queries; `fingerprint` names the tokenizer they count
    tokens of and `metadata` where they come from."""

    def __init__(self, stored: StoredModel) -> None:
        self.stored = stored
        self.fingerprint = stored.fingerprint
        self.metadata = stored.metadata
        self.order = stored.order
        self.vocab_size = stored.fingerprint.vocab_size
        self.max_context = stored.order - 1
        # Index by depth: tokens[d], counts[d] for d = 1..order; starts[d] for d = 0..order - 1
        # gives the continuations of depth-d nodes in depth d + 1.
        self._tokens: list[np.ndarray] = [np.zeros(0, np.uint32), *stored.tokens]
        self._counts: list[np.ndarray] = [np.zeros(0, np.uint32), *stored.counts]
        self._starts: list[np.ndarray] = [np.array([0, len(stored.tokens[0])], dtype=np.int64), *stored.starts]
        root_index = np.full(self.vocab_size, -1, dtype=np.int64)
        root_index[stored.tokens[0]] = np.arange(len(stored.tokens[0]))
        # Memoryviews for the per-token Python path (on the mapped file: no copy).
        self._root_index = memoryview(root_index)
        self._token_view = [memoryview(np.ascontiguousarray(t)) for t in self._tokens]
        self._count_view = [memoryview(np.ascontiguousarray(c)) for c in self._counts]
        self._starts_view = [memoryview(np.ascontiguousarray(s)) for s in self._starts]
        # Drafting tables by depth, allocated by `prepare` and filled a node at a time:
        # _best[d][x] is 0 until known, then 1 (no continuation) or the best token + 2, with its
        # probability in _prob[d][x]; _links[d][x] is 0 until known, then the suffix link + 1.
        self._best: list[memoryview] = []
        self._prob: list[memoryview] = []
        self._links: list[memoryview] = []

    def prepare(self) -> None:
        """Allocate the drafting tables; idempotent. Zeroed memory costs nothing until written,
        so this takes the same time at any model size, and only the nodes drafting reaches are
        ever computed."""
        if self._best:
            return
        nodes = [1, *map(len, self.stored.tokens[: self.max_context])]
        self._best = [memoryview(np.zeros(n, np.uint32)) for n in nodes]
        self._prob = [memoryview(np.zeros(n, np.float64)) for n in nodes]
        self._links = [memoryview(np.zeros(n, np.int64)) for n in nodes]
        if self.max_context:
            self._links[1] = memoryview(np.ones(nodes[1], np.int64))  # depth 1 links to the root

    def _fill(self, depth: int, node: int) -> int:
        """Compute and keep _best and _prob of a context node; returns its _best entry."""
        starts = self._starts_view[depth]
        low, high = starts[node], starts[node + 1]
        value, prob = 1, 0.0
        if high - low > 64:
            counts = self._counts[depth + 1][low:high]
            top = low + int(counts.argmax())  # the first maximum: the smallest token id
            value, prob = self._token_view[depth + 1][top] + 2, int(counts.max()) / int(counts.sum(dtype=np.int64))
        elif high > low:
            counts = self._count_view[depth + 1]
            top = max(range(low, high), key=counts.__getitem__)
            value, prob = self._token_view[depth + 1][top] + 2, counts[top] / sum(counts[low:high])
        self._best[depth][node], self._prob[depth][node] = value, prob
        return value

    def _link(self, depth: int, node: int) -> int:
        """Compute and keep the suffix link of a node at depth >= 2 (the node of its context
        without the first token: the child of its parent's link); returns its _links entry."""
        parent = bisect_right(self._starts_view[depth - 1], node) - 1
        above = (self._links[depth - 1][parent] or self._link(depth - 1, parent)) - 1
        link = self._child(depth - 2, above, self._token_view[depth][node])
        if link < 0:  # the suffix of a stored n-gram is stored too, unless the file is damaged
            raise UserError(f"n-gram model {str(self.stored.path)!r} is corrupt (a context's suffix is missing)")
        self._links[depth][node] = link + 1
        return link + 1

    def _child(self, depth: int, node: int, token: int) -> int:
        """The node at depth + 1 that continues (depth, node) with `token`, or -1."""
        if depth == 0:
            return self._root_index[token] if 0 <= token < self.vocab_size else -1
        starts = self._starts_view[depth]
        low, high = starts[node], starts[node + 1]
        tokens = self._token_view[depth + 1]
        child = bisect_left(tokens, token, low, high)
        return child if child < high and tokens[child] == token else -1

    def _find(self, sequence: Sequence[int], start: int, end: int) -> int:
        """Node of sequence[start:end] (a non-empty context) at depth end - start, or -1."""
        node = self._child(0, 0, sequence[start])
        for depth in range(1, end - start):
            if node < 0:
                return -1
            node = self._child(depth, node, sequence[start + depth])
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
            node = (self._links[depth][node] or self._link(depth, node)) - 1
            depth -= 1

    def predictor(self, depth: int, node: int, backoff: bool = True) -> tuple[int, int] | None:
        """The context node whose distribution predicts the next token in state (depth, node):
        with back-off the longest suffix that has continuations, else the full order - 1 token
        context if it has any; None when there is none."""
        best, fill, links = self._best, self._fill, self._links
        if backoff:
            while depth and (best[depth][node] or fill(depth, node)) == 1:
                node = (links[depth][node] or self._link(depth, node)) - 1
                depth -= 1
        elif depth != self.max_context:
            return None
        return (depth, node) if (best[depth][node] or fill(depth, node)) > 1 else None

    def greedy_draft(self, depth: int, node: int, k: int, backoff: bool, min_prob: float, limit: int) -> list[int]:
        """Up to k most-probable tokens from state (depth, node): stops at an unseen context,
        a best token below min_prob, or a token id >= limit. One loop: this is the hot path."""
        best, prob, links, fill = self._best, self._prob, self._links, self._fill
        full, step = self.max_context, self.step
        drafted: list[int] = []
        for _ in range(k):
            d, x = depth, node
            value = best[d][x] or fill(d, x)
            if backoff:
                while value == 1 and d:
                    x = (links[d][x] or self._link(d, x)) - 1
                    d -= 1
                    value = best[d][x] or fill(d, x)
            elif d != full:
                break
            token = value - 2
            if token < 0 or token >= limit or prob[d][x] < min_prob:
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
        """Most probable continuation of a context node (-1 for none) and its probability."""
        if not self._best:
            self.prepare()
        return (self._best[depth][node] or self._fill(depth, node)) - 2, self._prob[depth][node]

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
