"""Rollback policies: how a cached model goes back to a prefix of what it was fed.

A policy only says what to keep or feed again (a `Plan`: crop, restore states then crop, or
re-feed); `polyspec.cached_lm.CachedLM` alone changes its cache and length.

- `CropPolicy` (crop.py): attention-only models; dropping cache entries is exact.
- `DeltaRuleStates` (delta_states.py): gated delta-net layers (Qwen3.5); the recurrent state
  after every position of a verify call, copied back on rollback.
- `SnapshotRefeed` (refeed.py): any cache whose states can be copied; restore the copy taken
  before a forward and feed its kept tokens again.
"""

from __future__ import annotations

import torch

from polyspec.errors import UserError
from polyspec.state_rollback.base import RollbackPolicy
from polyspec.state_rollback.crop import CropPolicy
from polyspec.state_rollback.delta_states import (
    DEFAULT_STEP_LIMIT,
    DeltaRuleStates,
    delta_rule_layers,
    stepwise_delta_rule,
)
from polyspec.state_rollback.plans import Crop, Plan, Refeed, Restore, States
from polyspec.state_rollback.refeed import SnapshotRefeed

__all__ = [
    "DEFAULT_STEP_LIMIT",
    "MODES",
    "Crop",
    "CropPolicy",
    "DeltaRuleStates",
    "Plan",
    "Refeed",
    "Restore",
    "RollbackPolicy",
    "SnapshotRefeed",
    "States",
    "delta_rule_layers",
    "policy_for",
    "stepwise_delta_rule",
]

MODES = ("auto", "crop", "states", "refeed")
# Layer types whose cache holds a state that dropping entries cannot undo.
STATEFUL_TYPES = frozenset({"linear_attention", "conv", "mamba", "hybrid", "hybrid_sliding"})


def stateful_layer_types(model: torch.nn.Module) -> set[str]:
    config = model.config.get_text_config()
    return set(getattr(config, "layer_types", None) or []) & STATEFUL_TYPES


def policy_for(model: torch.nn.Module, mode: str = "auto") -> RollbackPolicy:
    """The policy for `model`: `mode` 'auto' picks crop for attention-only models and
    per-position states for gated delta-net hybrids; other stateful layers are a UserError."""
    if mode not in MODES:
        raise UserError(f"unknown rollback mode {mode!r}: use {', '.join(MODES)}")
    if mode == "crop":
        return CropPolicy()
    if mode == "refeed":
        return SnapshotRefeed()
    stateful = stateful_layer_types(model)
    if not stateful and mode == "auto":
        return CropPolicy()
    layers = delta_rule_layers(model)
    if stateful == {"linear_attention"} and layers:
        return DeltaRuleStates(layers)
    kinds = ", ".join(sorted(stateful)) or "none"
    raise UserError(
        f"{type(model).__name__} has recurrent-state layers ({kinds}) that polyspec cannot cut back after a "
        "rejection: only gated delta-net linear attention (Qwen3.5) is supported"
    )
