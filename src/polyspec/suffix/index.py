"""Longest-match queries on a token text and its suffix array.

The text is kept as big-endian 4-byte token ids, so comparing byte strings compares token
sequences, and a binary search over the suffix array compares a pattern with a slice of the
text in one memcmp (the slice of a memory-mapped file or of bytes is plain bytes). A *match* is
the interval [lo, hi) of the suffix array whose suffixes start with a pattern of `length` tokens
and go on with a token (occurrences at a document's end do not count: nothing follows them), so
the match's continuations are one token-sorted run of the text, and appending a token narrows
the interval with two binary searches inside it.

The longest suffix of a context that occurs is found by binary search on its length (if a
suffix occurs, so do all shorter ones). Appending a token x to a context whose longest match is
M yields M + x when that occurs, and otherwise a suffix of M + x no longer than M, so a drafter
moves from match to match (`extend`) without searching the whole context again; a pure function
of (M, x), which the drafter caches.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from polyspec.vocabulary import Fingerprint

MAX_MATCH = 32  # longest match considered, in tokens
MAX_OCCURRENCES = 256  # occurrences whose continuations are counted, evenly spaced, per match
_END = b"\xff\xff\xff\xff"  # the separator's bytes: above every token's
_SHORT_SPAN = 24  # spans up to this many occurrences are counted in Python


class Match(NamedTuple):
    lo: int  # the suffixes starting with the matched tokens and a continuation: sa[lo:hi]
    hi: int
    length: int  # matched tokens (0: the empty match, every suffix)


def pattern_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as the text stores them: 4 big-endian bytes each."""
    return np.asarray(tokens, dtype=">u4").tobytes()


class SuffixIndex:
    """`buffer[offset:]` holds the text (big-endian uint32, a separator after every document),
    `suffix_array` its suffixes that start with a token, in order. `fingerprint` names the
    tokenizer whose ids the text holds, `metadata` where the text comes from."""

    def __init__(
        self,
        buffer,
        offset: int,
        suffix_array: np.ndarray,
        fingerprint: Fingerprint,
        documents: int,
        metadata: dict | None = None,
    ) -> None:
        self._buffer, self._offset = buffer, offset
        self.suffix_array = suffix_array
        self.text = np.frombuffer(buffer, dtype=">u4", count=len(suffix_array) + documents, offset=offset)
        self.fingerprint = fingerprint
        self.vocab_size = fingerprint.vocab_size
        self.documents = documents
        self.num_tokens = len(suffix_array)
        self.metadata = metadata or {}
        self.path, self.file_size = None, 0  # set when loaded from a file
        self._sa = memoryview(np.ascontiguousarray(suffix_array))  # items are Python ints
        self.root = Match(0, len(suffix_array), 0)
        self._buckets: dict[bytes, tuple[int, int]] = {}

    def _key(self, width: int):
        buffer, offset = self._buffer, self._offset
        return lambda start: buffer[offset + 4 * start : offset + 4 * start + width]

    def token_after(self, rank: int, length: int) -> int:
        """The token `length` tokens into the suffix sa[rank]."""
        at = self._offset + 4 * (self._sa[rank] + length)
        return int.from_bytes(self._buffer[at : at + 4], "big")

    def span(self, pattern: bytes, lo: int, hi: int) -> tuple[int, int]:
        """The suffixes in sa[lo:hi] that start with `pattern` and a token after it."""
        key = self._key(len(pattern) + 4)
        first = bisect_left(self._sa, pattern, lo, hi, key=key)
        return first, bisect_left(self._sa, pattern + _END, first, hi, key=key)

    def _bucket(self, token: bytes) -> tuple[int, int]:
        """The span of a one-token pattern, where every longer pattern it starts lies; kept."""
        found = self._buckets.get(token)
        if found is None:
            found = self._buckets[token] = self.span(token, 0, self.num_tokens)
        return found

    def _first(self, pattern: bytes) -> int:
        """Where the span of `pattern` begins, or -1 when it is empty."""
        lo, hi = self._bucket(pattern[:4])
        if lo == hi or len(pattern) == 4:
            return lo if lo < hi else -1
        key = self._key(len(pattern) + 4)
        first = bisect_left(self._sa, pattern, lo, hi, key=key)
        if first == hi:
            return -1
        found = key(self._sa[first])
        return first if found[: len(pattern)] == pattern and found[len(pattern) :] != _END else -1

    def longest(self, window: bytes, max_length: int = MAX_MATCH) -> Match:
        """The longest suffix of `window` (pattern bytes), at most `max_length` tokens, that
        occurs in the text followed by a token."""
        low, high, first = 0, min(len(window) // 4, max_length), 0
        while low < high:
            middle = (low + high + 1) // 2
            found = self._first(window[len(window) - 4 * middle :])
            if found >= 0:
                low, first = middle, found
            else:
                high = middle - 1
        if low == 0:
            return self.root
        pattern = window[len(window) - 4 * low :]
        end = bisect_left(
            self._sa, pattern + _END, first, self._bucket(pattern[:4])[1], key=self._key(len(pattern) + 4)
        )
        return Match(first, end, low)

    def extend(self, match: Match, window: bytes, max_length: int = MAX_MATCH) -> Match:
        """The match after appending a token, from the match before it: `window` ends with the
        match's tokens and the new one."""
        length = match.length
        if length < max_length:
            lo, hi = self.span(window[len(window) - 4 * (length + 1) :], match.lo, match.hi)
            if lo < hi:
                return Match(lo, hi, length + 1)
            return self.longest(window, length)
        # At the cap the match slides: its first token drops off when the last max_length tokens
        # occur (one search in their first token's bucket), as they do along a copied passage.
        pattern = window[len(window) - 4 * max_length :]
        lo, hi = self.span(pattern, *self._bucket(pattern[:4]))
        if lo < hi:
            return Match(lo, hi, max_length)
        return self.longest(window, max_length - 1)

    def most_frequent(self, match: Match, max_occurrences: int = MAX_OCCURRENCES) -> tuple[int, float]:
        """(the most frequent continuation of a match, the smallest id on a tie; its share),
        counted as `continuations` counts."""
        return self.most_frequent_move(match, max_occurrences)[:2]

    def most_frequent_move(
        self, match: Match, max_occurrences: int = MAX_OCCURRENCES
    ) -> tuple[int, float, Match | None]:
        """`most_frequent`, and the match extended by that token where counting found it on the
        way (else None; then `extend` finds it). Continuations are sorted, so one that begins and
        ends the match's span is the only one, and short spans are counted without numpy; either
        way the token's run of ranks is known, and the extended match is that run less the
        occurrences a separator follows (they sort last)."""
        lo, hi, length = match
        first = self.token_after(lo, length)
        if first == self.token_after(hi - 1, length):
            return first, 1.0, self._run_match(lo, hi, length + 1)
        if hi - lo <= min(_SHORT_SPAN, max_occurrences):
            best, best_count, best_end, token, count = first, 0, lo, first, 0
            for rank in range(lo, hi):
                following = self.token_after(rank, length)
                if following != token:
                    token, count = following, 0
                count += 1
                if count > best_count:
                    best, best_count, best_end = token, count, rank + 1
            return best, best_count / (hi - lo), self._run_match(best_end - best_count, best_end, length + 1)
        ids, counts = self.continuations(match, max_occurrences)
        best = int(np.argmax(counts))
        return int(ids[best]), float(counts[best] / counts.sum()), None

    def _run_match(self, lo: int, hi: int, length: int) -> Match | None:
        """The match of the ranks [lo, hi), whose suffixes share their first `length` tokens,
        less those that end there; None when they all do."""
        while hi > lo and self.token_after(hi - 1, length) == 0xFFFFFFFF:
            hi -= 1
        return Match(lo, hi, length) if hi > lo else None

    def continuations(self, match: Match, max_occurrences: int = MAX_OCCURRENCES) -> tuple[np.ndarray, np.ndarray]:
        """(token ids ascending, counts) of what follows the match, counted over its
        occurrences, or over `max_occurrences` of them evenly spaced in suffix order."""
        lo, hi = match.lo, match.hi
        if hi - lo <= max_occurrences:
            starts = self.suffix_array[lo:hi]
        else:
            starts = self.suffix_array[lo + (np.arange(max_occurrences) * (hi - lo)) // max_occurrences]
        following = self.text[starts.astype(np.int64) + match.length].astype(np.int64)  # sorted
        if len(following) == 0:
            return following, following
        change = np.flatnonzero(following[1:] != following[:-1]) + 1
        bounds = np.concatenate(([0], change, [len(following)]))
        return following[bounds[:-1]], np.diff(bounds)

    def longest_match(self, context: Sequence[int], max_length: int = MAX_MATCH) -> Match:
        """The longest suffix of `context` (token ids) that occurs followed by a token."""
        return self.longest(pattern_bytes(list(context)[-max_length:] if max_length else []), max_length)
