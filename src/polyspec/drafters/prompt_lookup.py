"""Prompt lookup: copy what followed the most recent earlier occurrence of the context's suffix.

The longest suffix (max_n down to min_n tokens) that occurred before wins. An index from each
n-gram to the end of its latest occurrence is updated with the tokens added since the last
call, so a proposal costs O(new tokens), not O(context).
"""

from __future__ import annotations

from collections.abc import Sequence

from polyspec.errors import UserError
from polyspec.types import EMPTY_DRAFT, Draft


class PromptLookupDrafter:
    def __init__(self, min_n: int = 1, max_n: int = 3) -> None:
        if not 1 <= min_n <= max_n:
            raise UserError(f"prompt lookup needs 1 <= min n <= max n, got {min_n} and {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._tokens: list[int] = []
        self._latest_end: dict[tuple[int, ...], int] = {}

    def start(self, prompt_ids, processor, generator) -> None:
        self._tokens = []
        self._latest_end = {}

    def _extend_index(self, context: Sequence[int]) -> None:
        known = len(self._tokens)
        if len(context) < known or context[:known] != self._tokens:
            self._tokens, self._latest_end, known = [], {}, 0
        self._tokens.extend(context[known:])
        tokens = self._tokens
        # Index n-grams that have a continuation: those ending before the last token.
        for end in range(max(known, 1), len(tokens)):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._latest_end[tuple(tokens[end - n : end])] = end

    def propose(self, context: Sequence[int], k: int) -> Draft:
        if k <= 0:
            return EMPTY_DRAFT
        self._extend_index(list(context))
        tokens = self._tokens
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            end = self._latest_end.get(tuple(tokens[-n:]))
            if end is not None:
                # Continue past the context's end by copying the draft itself (a loop repeats).
                draft: list[int] = []
                for pos in range(end, end + k):
                    draft.append(tokens[pos] if pos < len(tokens) else draft[pos - len(tokens)])
                return Draft(tokens=draft)
        return EMPTY_DRAFT
