"""Attention-only models: dropping the last cache entries is the whole rollback."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext

from polyspec.state_rollback.plans import Crop, Plan, States


class CropPolicy:
    name = "crop"
    conv_past = False
    supports_trees = True

    def begin(self) -> None:
        pass

    def recording(self, start: int, tokens: Sequence[int], snapshot: Callable[[], States | None]):
        return nullcontext()

    def plan(self, cached: int, length: int) -> Plan:
        return Crop(length)

    def settled(self, length: int) -> None:
        pass
