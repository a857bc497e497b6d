"""polyspec: lossless speculative decoding that pays off in every language.

    import polyspec
    engine = polyspec.Engine("gemma3-270m")
    out = engine.generate("Article 1.", drafter="prompt-lookup", max_new_tokens=64)

`import polyspec` is cheap: the names below load their modules (and torch) on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from polyspec.version import __version__

# public name -> the module that defines it (a module of its own where the value is None)
_LAZY = {
    "Engine": "polyspec.api",
    "Stream": "polyspec.api",
    "Chunk": "polyspec.api",
    "generate": "polyspec.api",
    "Generation": "polyspec.types",
    "GenerationStats": "polyspec.types",
    "SamplingConfig": "polyspec.sampling",
    "TextStream": "polyspec.streaming",
    "UserError": "polyspec.errors",
    "drafters": None,
    "ngram": None,
}

__all__ = [
    "Chunk",
    "Engine",
    "Generation",
    "GenerationStats",
    "SamplingConfig",
    "Stream",
    "TextStream",
    "UserError",
    "__version__",
    "drafters",
    "generate",
    "ngram",
]

if TYPE_CHECKING:
    from polyspec import drafters, ngram
    from polyspec.api import Chunk, Engine, Stream, generate
    from polyspec.errors import UserError
    from polyspec.sampling import SamplingConfig
    from polyspec.streaming import TextStream
    from polyspec.types import Generation, GenerationStats


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'polyspec' has no attribute {name!r}")
    module_name = _LAZY[name]
    if module_name is None:
        value = importlib.import_module(f"polyspec.{name}")
    else:
        value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
