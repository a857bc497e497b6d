"""What a rollback does, as data: the policies say it, `CachedLM` carries it out.

- `Crop(length)`: cut the cache back to its first `length` tokens (attention KV, and the
  convolution inputs of layers that record them).
- `Restore(length, states)`: crop to `length`, then copy `states` back into the cache.
- `Refeed(base, tokens)`: carry out `base` (a `Restore`; None: start from an empty cache), then
  feed `tokens` again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_NOTHING = object()


@dataclass(frozen=True)
class States:
    """Values to copy back into a cache.

    `layers` maps a cache layer's index to its attributes' values (a dict value is merged key by
    key into the layer's dict); `cache` holds attributes of the cache object itself; `modules` maps
    a submodule's name to the states the model keeps on the module itself (RecurrentGemma); `whole`,
    when set, is a copy of an entire cache object that is not a transformers `Cache`.
    """

    layers: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    cache: Mapping[str, Any] = field(default_factory=dict)
    modules: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    whole: Any = _NOTHING

    @property
    def has_whole(self) -> bool:
        return self.whole is not _NOTHING


@dataclass(frozen=True)
class Crop:
    length: int


@dataclass(frozen=True)
class Restore:
    length: int
    states: States


@dataclass(frozen=True)
class Refeed:
    base: Restore | None
    tokens: tuple[int, ...]

    @property
    def length(self) -> int:
        return (self.base.length if self.base is not None else 0) + len(self.tokens)


Plan = Crop | Restore | Refeed
