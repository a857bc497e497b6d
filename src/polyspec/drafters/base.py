"""The drafter protocol.

A drafter proposes up to k tokens after the context, with the distribution each was drawn from
(or None: a point mass). It never touches the verifier's cache. Drafters are built from objects
(a model, an n-gram model, options); spec strings are parsed at the edge (`polyspec.specs`).

A drafter that can branch also has `propose_tree(context, budget, max_depth)`: a token tree
(`polyspec.tree`) of at most `budget` nodes and `max_depth` levels, both chosen per call by the
engine or by a policy around the drafter. Its distributions must be what tree acceptance assumes:
point masses with distinct siblings, or siblings drawn independently from one shared row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from polyspec.sampling import LogitsProcessor
from polyspec.tree import EMPTY_TREE, TokenTree
from polyspec.types import EMPTY_DRAFT, Draft


class Drafter(Protocol):
    def start(self, prompt_ids: Sequence[int], processor: LogitsProcessor, generator: torch.Generator) -> None:
        """A new sequence begins. `processor` says how the verifier turns logits into choices
        (greedy or sampling); a drafter that samples draws from `generator`."""

    def propose(self, context: Sequence[int], k: int) -> Draft:
        """Up to k tokens to follow `context` (prompt and everything accepted so far)."""


class TreeDrafter(Drafter, Protocol):
    def propose_tree(self, context: Sequence[int], budget: int, max_depth: int) -> TokenTree:
        """Up to `budget` nodes at most `max_depth` deep to follow `context`."""


class DrawingDrafter(Drafter, Protocol):
    def propose_sampled_tree(self, context: Sequence[int], widths: Sequence[int]) -> TokenTree:
        """Sampling only: widths[d] independent draws from the row of every node at depth d."""


def can_branch(drafter: Drafter) -> bool:
    return callable(getattr(drafter, "propose_tree", None))


def can_draw(drafter: Drafter) -> bool:
    return callable(getattr(drafter, "propose_sampled_tree", None))


class NoDrafter:
    """Plain decoding: every step is one verifier call that emits one token."""

    def start(self, prompt_ids, processor, generator) -> None:
        pass

    def propose(self, context, k) -> Draft:
        return EMPTY_DRAFT

    def propose_tree(self, context, budget, max_depth) -> TokenTree:
        return EMPTY_TREE
