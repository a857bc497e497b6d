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
    """The policy for `model`. 'auto': crop for attention-only models, per-position states for
    gated delta-net hybrids (Qwen3.5, Qwen3-Next: measured faster there, docs/HYBRID.md), snapshot
    and re-feed for every other recurrent or convolution state (Mamba, LFM2, RWKV, ...). A model
    whose layer types say nothing is taken as attention-only until its first forward shows a cache
    that holds more (`CachedLM` then switches to snapshot and re-feed)."""
    if mode not in MODES:
        raise UserError(f"unknown rollback mode {mode!r}: use {', '.join(MODES)}")
    if mode == "crop":
        return CropPolicy()
    if mode == "refeed":
        return SnapshotRefeed()
    stateful = stateful_layer_types(model)
    layers = delta_rule_layers(model)
    if stateful == {"linear_attention"} and layers and _all_linear_layers_are(model, layers):
        return DeltaRuleStates(layers)
    if mode == "states":
        raise UserError(
            f"{type(model).__name__} has no gated delta-net layers to keep per-position states of: "
            "use rollback mode auto or refeed"
        )
    return SnapshotRefeed() if stateful or _has_state_argument(model) else CropPolicy()


def _all_linear_layers_are(model: torch.nn.Module, layers: list[torch.nn.Module]) -> bool:
    """Every linear-attention layer of the config is one of the recordable gated delta-net layers."""
    config = model.config.get_text_config()
    linear = [i for i, kind in enumerate(config.layer_types) if kind == "linear_attention"]
    return linear == [module.layer_idx for module in layers]


def _has_state_argument(model: torch.nn.Module) -> bool:
    """Models whose forward takes a recurrent state rather than past keys and values."""
    import inspect

    parameters = inspect.signature(model.forward).parameters
    return "past_key_values" not in parameters and ("cache_params" in parameters or "state" in parameters)
