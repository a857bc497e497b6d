"""Prompt lookup: copy what followed earlier occurrences of the context's suffix.

The longest suffix (max_n down to min_n tokens) that occurred before wins, and a chain copies
what followed its most recent occurrence. A tree copies what followed several occurrences, the
longer and more recent first, as branches that share their common beginnings. An index from each
n-gram to the ends of its latest occurrences is updated with the tokens added since the last
call, so a proposal costs O(new tokens), not O(context).
"""

from __future__ import annotations

from collections.abc import Sequence

from polyspec.errors import UserError
from polyspec.tree import EMPTY_TREE, TokenTree, best_first
from polyspec.types import EMPTY_DRAFT, Draft

OCCURRENCES = 8  # latest occurrences remembered per n-gram: the branches a tree can copy


class PromptLookupDrafter:
    def __init__(self, min_n: int = 1, max_n: int = 3) -> None:
        if not 1 <= min_n <= max_n:
            raise UserError(f"prompt lookup needs 1 <= min n <= max n, got {min_n} and {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._tokens: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}  # latest last

    def start(self, prompt_ids, processor, generator) -> None:
        self._tokens = []
        self._ends = {}

    def _extend_index(self, context: Sequence[int]) -> None:
        known = len(self._tokens)
        if len(context) < known or context[:known] != self._tokens:
            self._tokens, self._ends, known = [], {}, 0
        self._tokens.extend(context[known:])
        tokens, index = self._tokens, self._ends
        # Index n-grams that have a continuation: those ending before the last token.
        for end in range(max(known, 1), len(tokens)):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                ends = index.setdefault(tuple(tokens[end - n : end]), [])
                ends.append(end)
                if len(ends) > OCCURRENCES:
                    del ends[0]

    def _continuation(self, end: int, k: int) -> list[int]:
        """k tokens copied from `end` on; past the context's end the copy copies itself (a loop repeats)."""
        tokens = self._tokens
        copied: list[int] = []
        for pos in range(end, end + k):
            copied.append(tokens[pos] if pos < len(tokens) else copied[pos - len(tokens)])
        return copied

    def propose(self, context: Sequence[int], k: int) -> Draft:
        if k <= 0:
            return EMPTY_DRAFT
        self._extend_index(list(context))
        tokens = self._tokens
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            ends = self._ends.get(tuple(tokens[-n:]))
            if ends:
                return Draft(tokens=self._continuation(ends[-1], k))
        return EMPTY_DRAFT

    def propose_tree(self, context: Sequence[int], budget: int, max_depth: int) -> TokenTree:
        """The continuations of up to `budget` earlier occurrences, ranked by match length, then
        recency; each weighs half the one before it, and a node's estimated probability is the
        weight of the occurrences through it over the weight through its parent."""
        if budget <= 0 or max_depth <= 0:
            return EMPTY_TREE
        self._extend_index(list(context))
        tokens = self._tokens
        starts: list[int] = []
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            for end in reversed(self._ends.get(tuple(tokens[-n:]), ())):
                if end not in starts:
                    starts.append(end)
        del starts[budget:]
        if not starts:
            return EMPTY_TREE
        # A trie of the copied continuations: path -> {token: weight}.
        trie: dict[tuple[int, ...], dict[int, float]] = {}
        for rank, end in enumerate(starts):
            weight = 0.5**rank
            path: tuple[int, ...] = ()
            for token in self._continuation(end, max_depth):
                below = trie.setdefault(path, {})
                below[token] = below.get(token, 0.0) + weight
                path = (*path, token)

        def expand(node: int, path: list[int], limit: int) -> list[tuple[int, float]]:
            below = trie.get(tuple(path))
            if not below:
                return []
            total = sum(below.values())
            ranked = sorted(below.items(), key=lambda item: -item[1])[:limit]
            return [(token, weight / total) for token, weight in ranked]

        return best_first(expand, budget, max_depth)
