"""The drafter protocol and the registry that turns a spec like 'ngram:PATH' into a drafter.

A drafter proposes up to k tokens after the context, with the distribution each was drawn from
(or None: a point mass), and is told how many the verifier accepted. It never touches the
verifier's cache.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from polyspec.errors import UserError
from polyspec.sampling import LogitsProcessor
from polyspec.types import EMPTY_DRAFT, Draft

if TYPE_CHECKING:
    from polyspec.models import LoadedModel


class Drafter(Protocol):
    def start(self, prompt_ids: Sequence[int], processor: LogitsProcessor, generator: torch.Generator) -> None:
        """A new sequence begins. `processor` says how the verifier turns logits into choices
        (greedy or sampling); a drafter that samples draws from `generator`."""

    def propose(self, context: Sequence[int], k: int) -> Draft:
        """Up to k tokens to follow `context` (prompt and everything accepted so far)."""

    def observe(self, num_accepted: int) -> None:
        """How many tokens of the last proposal the verifier kept."""


class NoDrafter:
    """Plain decoding: every step is one verifier call that emits one token."""

    def start(self, prompt_ids, processor, generator) -> None:
        pass

    def propose(self, context, k) -> Draft:
        return EMPTY_DRAFT

    def observe(self, num_accepted) -> None:
        pass


@dataclass(frozen=True)
class DrafterSpec:
    kind: str
    argument: str


# kind -> "module:function"; each factory takes (argument, verifier) and returns a Drafter.
# Modules are imported only when used, so a new drafter is one line here and a module.
_FACTORIES = {
    "none": "polyspec.drafters.base:make_none",
    "prompt-lookup": "polyspec.drafters.prompt_lookup:make",
    "model": "polyspec.drafters.model:make",
    "ngram": "polyspec.drafters.ngram:make",
    "distill": "polyspec.drafters.distilled:make",
}


def parse_spec(spec: str) -> DrafterSpec:
    kind, _, argument = spec.partition(":")
    if kind not in _FACTORIES:
        raise UserError(f"unknown drafter {spec!r}: use one of none, prompt-lookup, ngram:PATH, model:PATH_OR_ID")
    return DrafterSpec(kind=kind, argument=argument)


def make_drafter(spec: str, verifier: LoadedModel) -> Drafter:
    parsed = parse_spec(spec)
    module_name, _, function = _FACTORIES[parsed.kind].partition(":")
    factory = getattr(importlib.import_module(module_name), function)
    return factory(parsed.argument, verifier)


def make_none(argument: str, verifier: LoadedModel) -> Drafter:
    if argument:
        raise UserError(f"drafter 'none' takes no argument, got {argument!r}")
    return NoDrafter()
