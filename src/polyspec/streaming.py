"""Incremental detokenisation: token ids in, text out, never a broken character or a stop string.

Token ids arrive a few at a time (each verifier call adds one or more). Decoding each piece on
its own would break characters that span several tokens (with byte-fallback tokens one Cherokee
or Amharic letter can be three tokens, a rare Chinese character or a mathematical letter four)
and lose the spaces a tokenizer puts between tokens. `TextStream` decodes a short window of
recent tokens and emits only the text that the newest tokens add, so that:

- text ending in U+FFFD (an incomplete UTF-8 sequence so far) is held back until the next
  tokens complete it (at the end it is emitted as the decoder renders it);
- a suffix that could be the start of a stop string is held back until it is known not to be;
- nothing at or after a stop string is ever emitted: the text ends just before it;
- the pieces joined are the decoding of all tokens, cut before the first stop string.

It needs only a tokenizer with `decode(ids, skip_special_tokens=...)`, and it is exact for any
tokenizer whose decoding of a sequence extends the decoding of its prefixes (byte-level BPE,
SentencePiece with byte fallback, word-level), which the window relies on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

REPLACEMENT = "\ufffd"
# Settled tokens decoded before the new ones, so that the decoder sees what decides spacing
# and merges (a character spans at most 4 byte tokens).
CONTEXT_TOKENS = 6


class TextStream:
    """Turns pushed token ids into pieces of text that are safe to show.

    `push(ids)` returns the text that became final (possibly ""); `finish()` returns what was
    held back when the sequence ends. Once a stop string is found `stopped` is True, `stop_string`
    says which, and later calls return "".
    """

    def __init__(self, tokenizer, stop_strings: Iterable[str] = (), skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""  # everything emitted so far
        self.stopped = False
        self.stop_string: str | None = None
        self._longest_stop = max((len(s) for s in self.stop_strings), default=0)
        # All text of ids[:settled] is emitted; ids[start:settled] decode to `base`, and
        # `since` is what was emitted of the text after `base`.
        self._start = 0
        self._settled = 0
        self._base = ""
        self._since = ""

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=self.skip_special_tokens)

    def push(self, ids: Iterable[int]) -> str:
        """Add token ids; returns the text that is now final."""
        if self.stopped:
            return ""
        self.ids.extend(ids)
        return self._advance(final=False)

    def finish(self) -> str:
        """The sequence ended: returns the text held back (an incomplete character as the
        decoder renders it, the start of a stop string that never completed)."""
        if self.stopped:
            return ""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        window = self._decode(self.ids[self._start :])
        # If the context decodes differently followed by the new tokens, decode these alone.
        stable = window.startswith(self._base)
        fresh = window[len(self._base) :] if stable else self._decode(self.ids[self._settled :])
        if not fresh.startswith(self._since):
            # The decoder rewrote text it had produced (not prefix-stable): what is out stays out.
            fresh = self._since + fresh[len(self._since) :]
        candidate = fresh if final else fresh.rstrip(REPLACEMENT)
        new = candidate[len(self._since) :]
        emit = self._emittable(new, final)
        self.text += emit
        self._since += emit
        if not self.stopped and self._since == fresh:
            # Everything decoded so far is out: the next window starts a few tokens back.
            self._settled = len(self.ids)
            self._start = self._window_start()
            self._base = self._decode(self.ids[self._start : self._settled])
            self._since = ""
        return emit

    def _window_start(self) -> int:
        """A few tokens before the settled point, at the start of a character: a window that
        began inside one would decode its last bytes as U+FFFD."""
        start = max(0, self._settled - CONTEXT_TOKENS)
        for candidate in range(start, max(-1, start - 2 * CONTEXT_TOKENS), -1):
            if not self._decode(self.ids[candidate : self._settled]).startswith(REPLACEMENT):
                return candidate
        return self._settled  # no clean start nearby: the next window decodes the new tokens alone

    def _emittable(self, new: str, final: bool) -> str:
        """The part of `new` (text after everything emitted) that may be emitted now."""
        if not self.stop_strings or not new:
            return new
        # Emitted text never ends in the start of a stop string (that is held back), but a stop
        # string may still begin there when it overlaps itself: search with the tail.
        tail = self.text[len(self.text) - (self._longest_stop - 1) :] if self._longest_stop > 1 else ""
        joined = tail + new
        found = first_stop(joined, self.stop_strings)
        if found is not None:
            index, stop = found
            self.stopped, self.stop_string = True, stop
            return new[: max(0, index - len(tail))]
        if final:
            return new
        hold = 0  # the longest suffix of the text that is a proper prefix of a stop string
        for stop in self.stop_strings:
            for length in range(min(len(stop) - 1, len(joined)), hold, -1):
                if joined.endswith(stop[:length]):
                    hold = length
                    break
        return new[: len(new) - min(hold, len(new))]


def first_stop(text: str, stop_strings: Iterable[str]) -> tuple[int, str] | None:
    """Where the earliest stop string in `text` begins, and which one (None: none occurs)."""
    best: tuple[int, str] | None = None
    for stop in stop_strings:
        index = text.find(stop) if stop else -1
        if index != -1 and (best is None or index < best[0]):
            best = (index, stop)
    return best


def cut_at_stop(text: str, stop_strings: Iterable[str]) -> str:
    """`text` ended just before its first stop string."""
    found = first_stop(text, stop_strings)
    return text if found is None else text[: found[0]]
