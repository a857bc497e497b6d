"""Snapshot and re-feed: works for any cache whose states can be copied.

Before each forward after the first, the policy takes a copy of the cache's recurrent and
convolution states (small: they do not grow with the sequence). Going back into the middle of a
forward restores the copy taken before it and feeds the kept tokens of that forward again; going
back to the start of a forward only restores. A cache with nothing but attention KV has nothing to
copy, and its rollback is a crop. Forwards are kept back to the last rollback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from polyspec.state_rollback.plans import Crop, Plan, Refeed, Restore, States


@dataclass(frozen=True)
class _Segment:
    start: int
    tokens: tuple[int, ...]
    states: States | None  # before the forward; None: nothing to copy (or the cache was empty)


class SnapshotRefeed:
    name = "refeed"
    conv_past = False
    supports_trees = False

    def __init__(self) -> None:
        self._segments: list[_Segment] = []

    def begin(self) -> None:
        self._segments = []

    @contextmanager
    def recording(self, start: int, tokens: Sequence[int], snapshot: Callable[[], States | None]) -> Iterator[None]:
        states = snapshot() if start > 0 else None
        self._segments.append(_Segment(start, tuple(tokens), states))
        yield

    def plan(self, cached: int, length: int) -> Plan:
        if length == cached:
            return Crop(length)
        for segment in reversed(self._segments):
            if segment.start <= length < segment.start + len(segment.tokens):
                kept = segment.tokens[: length - segment.start]
                if segment.start == 0:
                    return Refeed(None, kept)
                if segment.states is None:
                    return Crop(length)
                base = Restore(segment.start, segment.states)
                return Refeed(base, kept) if kept else base
        raise ValueError(f"cannot roll back to {length} tokens: it is before the last rollback")

    def settled(self, length: int) -> None:
        self._segments = []
