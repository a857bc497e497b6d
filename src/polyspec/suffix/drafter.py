"""The suffix drafter: drafts what followed the longest match of the context in a corpus.

Each step matches the longest suffix of the text (up to `max_match` tokens) that occurs in the
indexed corpus with a token after it, and counts what follows its occurrences (at most
`max_occurrences` of them, evenly spaced). With `+context` the prompt and accepted output are
matched too, through the n-gram drafter's live cache (contexts of up to context_order - 1
tokens); the live match wins unless the corpus matched longer than the live cache can reach
(the text repeating itself predicts better than a corpus that shares a long stretch with it).

Greedy verification: each step proposes the most frequent continuation (ties: the smaller id).
Sampling verification: each step draws from the continuation counts and returns those rows as
Draft.probs, so rejection sampling keeps the verifier's output distribution exact. Either way
a text with no match ends the draft.

The match at the end of the accepted text is advanced by the tokens added since the last
proposal; moving from a match to the next (`SuffixIndex.extend`) and a match's continuations
depend only on the match and the token, so both are kept in dictionaries keyed by the match,
and drafting along text seen before costs a few dictionary look-ups per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from polyspec.drafters.ngram import ContextCache
from polyspec.types import EMPTY_DRAFT, Draft

_MEMO_LIMIT = 1 << 18  # entries per memo before it starts over


@dataclass(frozen=True)
class SuffixOptions:
    use_context: bool = False
    max_match: int = 32
    max_occurrences: int = 256
    context_order: int = 8  # the live cache's n-gram order with +context


class SuffixDrafter:
    def __init__(self, index, vocab_size: int, options: SuffixOptions = SuffixOptions()) -> None:
        self.index = index
        self.vocab_size = vocab_size  # the verifier's: width of Draft.probs rows
        self.options = options
        self.usable_vocab = min(vocab_size, index.vocab_size)
        self.greedy = True
        self.generator: torch.Generator | None = None
        self._moves: dict = {}  # (lo, length, token) -> the match after the token
        self._best: dict = {}  # (lo, length) -> greedy prediction
        self._rows: dict = {}  # (lo, length) -> sampling prediction
        self._reset()

    def _reset(self) -> None:
        self._match = self.index.root
        self._window = b""  # the text's last max_match tokens, as pattern bytes
        self._fed, self._last = 0, -1
        self.cache = ContextCache(self.options.context_order - 1) if self.options.use_context else None

    def start(self, prompt_ids, processor, generator) -> None:
        self.greedy = processor.config.greedy
        self.generator = generator
        self._reset()

    # ---------------------------------------------------------------- matches

    def _move(self, match, window: bytes, token: int):
        """(the match after `token`, the window with it)."""
        window = (window + token.to_bytes(4, "big"))[-4 * self.options.max_match :]
        key = (match.lo, match.length, token)
        moved = self._moves.get(key)
        if moved is None:
            if len(self._moves) >= _MEMO_LIMIT:
                self._moves.clear()
            moved = self._moves[key] = self.index.extend(match, window, self.options.max_match)
        return moved, window

    def _advance(self, context: Sequence[int]) -> None:
        fed = self._fed
        if fed and (len(context) < fed or context[fed - 1] != self._last):
            fed = 0  # not a continuation of what was seen: start over
        if fed == 0:
            tail = [t if 0 <= t < self.usable_vocab else 0xFFFFFFFE for t in context[-self.options.max_match :]]
            self._window = np.asarray(tail, dtype=">u4").tobytes()
            self._match = self.index.longest(self._window, self.options.max_match)
        else:
            match, window = self._match, self._window
            for token in context[fed:]:
                match, window = self._move(match, window, int(token) if 0 <= token < self.usable_vocab else 0xFFFFFFFE)
            self._match, self._window = match, window
        self._fed, self._last = len(context), context[-1]
        if self.cache is not None:
            self.cache.sync(context)

    def _prediction(self, match):
        """What the corpus predicts after the match, or None for the empty match. Greedy:
        (best token, its probability); sampling: (ids, float32 probabilities, their float64
        running sum, the largest probability). Kept by match."""
        if match.length == 0:
            return None
        key = (match.lo, match.length)
        memo = self._best if self.greedy else self._rows
        if key in memo:
            return memo[key]
        found = None
        if self.greedy:
            token, share, moved = self.index.most_frequent_move(match, self.options.max_occurrences)
            found = token, share
            if moved is not None and match.length < self.options.max_match:  # what extend would find
                self._moves[(match.lo, match.length, token)] = moved
        if found is None or found[0] >= self.usable_vocab:  # sampling, or a token the verifier cannot emit
            ids, counts = self.index.continuations(match, self.options.max_occurrences)
            keep = ids < self.usable_vocab
            ids, counts = ids[keep], counts[keep].astype(np.float64)
            found = None
            if len(ids) and self.greedy:
                best = int(np.argmax(counts))  # the first of the most frequent: the smallest id
                found = int(ids[best]), float(counts[best] / counts.sum())
            elif len(ids):
                probs = (counts / counts.sum()).astype(np.float32)
                found = ids, probs, np.cumsum(probs, dtype=np.float64), float(counts.max() / counts.sum())
        if len(memo) >= _MEMO_LIMIT:
            memo.clear()
        memo[key] = found
        return found

    def _choose(self, match, live: list[int], bound: int):
        """The next token's source, ('corpus', prediction), ('live', cache entry) or None, and
        the bound for the next call. A live match wins unless the corpus match is longer, its
        length counted up to the live cache's reach, so a long corpus match does not outrank a
        live one that matched all it could. `bound` caps the live match's length: a
        live match of L + 1 tokens after a token holds one of L tokens before it, so each token
        raises the cap by one at most."""
        found = self._prediction(match)
        if self.cache is None:
            return (None if found is None else ("corpus", found)), 0
        table = self.cache.table
        # The shortest live match that wins: one as long as the corpus match, or as the cache reaches.
        shortest = min(match.length, self.cache.max_context) if found is not None else 1
        length = upper = min(bound, len(live))
        while length >= shortest:
            entry = table.get(tuple(live[-length:]))
            if entry is not None:
                break
            length -= 1
        else:
            return (None if found is None else ("corpus", found)), min(upper, shortest - 1) + 1
        return ("live", entry), length + 1

    # ---------------------------------------------------------------- drafting

    def propose(self, context: Sequence[int], k: int) -> Draft:
        if k <= 0 or not context:
            return EMPTY_DRAFT
        self._advance(context)
        live = list(context[-self.cache.max_context :]) if self.cache is not None else []
        match, window = self._match, self._window
        rows = None if self.greedy else np.zeros((k, self.vocab_size), dtype=np.float32)
        tokens: list[int] = []
        if rows is None and self.cache is None:  # greedy from the corpus alone: the loop inlined
            usable, prediction, move = self.usable_vocab, self._prediction, self._move
            for i in range(k):
                found = prediction(match)
                if found is None or found[0] >= usable:
                    break
                tokens.append(found[0])
                if i + 1 < k:  # the match after the last token waits until it is accepted
                    match, window = move(match, window, found[0])
            return Draft(tokens=tokens) if tokens else EMPTY_DRAFT
        bound = self.cache.max_context if self.cache is not None else 0
        for i in range(k):
            choice, bound = self._choose(match, live, bound)
            if choice is None:
                break
            token = choice[1][0] if self.greedy else self._sample(choice, rows[i])  # greedy: the best token
            if token >= self.usable_vocab:
                break
            tokens.append(token)
            if i + 1 == k:
                break
            match, window = self._move(match, window, token)
            if self.cache is not None:
                live.append(token)
                del live[0 : max(0, len(live) - self.cache.max_context)]
        if not tokens:
            return EMPTY_DRAFT
        if rows is None:
            return Draft(tokens=tokens)
        probs = torch.from_numpy(rows[: len(tokens)])
        if self.generator is not None and self.generator.device.type != "cpu":
            probs = probs.to(self.generator.device)
        return Draft(tokens=tokens, probs=probs)

    def _sample(self, choice, row: np.ndarray) -> int:
        """Fill `row` with the chosen distribution and draw a token from exactly those values."""
        if choice[0] == "corpus":
            ids, probs, cumulative = choice[1][:3]
        else:
            by_token = choice[1][3]
            ids = np.fromiter(by_token.keys(), dtype=np.int64, count=len(by_token))
            counts = np.fromiter(by_token.values(), dtype=np.float64, count=len(by_token))
            keep = ids < self.usable_vocab
            ids, counts = ids[keep], counts[keep]
            if len(ids) == 0:
                return self.usable_vocab  # nothing usable: the caller ends the draft
            probs = (counts / counts.sum()).astype(np.float32)
            cumulative = np.cumsum(probs, dtype=np.float64)
        row[ids] = probs
        generator = self.generator
        uniform = float(torch.rand((), generator=generator, device=generator.device if generator else "cpu"))
        pick = int(np.searchsorted(cumulative, uniform * cumulative[-1], side="right"))
        return int(ids[min(pick, len(ids) - 1)])
