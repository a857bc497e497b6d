"""The protocol every rollback policy follows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from polyspec.state_rollback.plans import Plan, States


class RollbackPolicy(Protocol):
    """Decides how a cached model goes back to a prefix of what it was fed; never touches the cache.

    `CachedLM` calls `begin` on an empty cache, wraps each forward in `recording` (the policy may
    take a copy of the cache's states through `snapshot`, which returns None when the cache holds
    nothing that cropping cannot cut back), asks `plan` how to go back to `length` tokens out of
    `cached`, carries the plan out, then calls `settled(length)`.
    """

    name: str
    conv_past: bool  # the cache's convolution states must keep every input since the last cut
    supports_trees: bool  # a forward may feed a token tree (cropping and gathering are exact)

    def begin(self) -> None: ...

    def recording(
        self, start: int, tokens: Sequence[int], snapshot: Callable[[], States | None]
    ) -> AbstractContextManager[None]: ...

    def plan(self, cached: int, length: int) -> Plan: ...

    def settled(self, length: int) -> None: ...
