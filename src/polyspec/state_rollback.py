"""Cutting back hybrid models whose layers carry a recurrent state (Qwen3.5's gated delta-net).

A KV cache is cut back by dropping its last entries. A recurrent state cannot be: it is one
tensor that every token fed has updated, and transformers' `crop` only cuts back the short
convolution states (which, with past recording on, keep every input since the last crop).
So for each forward we keep the recurrent state of every linear-attention layer after each of
its positions, and a rollback copies back the states of the last kept position, while `crop`
cuts back the convolution states and the full-attention KV.

Two ways to have those states, chosen by `mode` (docs/HYBRID.md measures both):
- "states" (default): forwards of at most `step_limit` tokens (a verification: the pending token
  plus the draft) run the recurrence one token at a time, the rule single-token decoding uses,
  and keep the state after every token. The states are tensors the recurrence creates anyway,
  so keeping them costs no copy.
- "refeed": every forward keeps only its final state (again no copy), and a rollback into the
  middle of a forward restores the state at its start and feeds the kept tokens again.
Forwards wider than `step_limit` (a prompt) always use the model's chunked rule and are re-fed
in the rare case a rollback lands inside one.

The recurrence is reached through the module-level functions the modeling code calls by name
(`torch_chunk_gated_delta_rule`, `torch_recurrent_gated_delta_rule`); they are swapped only for
the duration of one forward of the model being recorded.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from polyspec.errors import UserError

if TYPE_CHECKING:
    from polyspec.cached_lm import CachedLM

RULE_NAMES = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
# Layer types whose cache holds a state that dropping entries cannot undo.
STATEFUL_TYPES = frozenset({"linear_attention", "conv", "mamba", "hybrid", "hybrid_sliding"})
MODES = ("states", "refeed")
# Wide enough for any verification (gamma + 1 tokens); narrow enough that a prompt never runs
# token by token.
DEFAULT_STEP_LIMIT = 16


def stateful_layer_types(model: torch.nn.Module) -> set[str]:
    config = model.config.get_text_config()
    return set(getattr(config, "layer_types", None) or []) & STATEFUL_TYPES


def delta_rule_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's gated delta-net layers, in execution order (each has a `layer_idx`)."""
    layers = []
    for module in model.modules():
        namespace = sys.modules.get(type(module).__module__)
        if hasattr(module, "layer_idx") and type(module).__name__.endswith("GatedDeltaNet"):
            if namespace is None or not all(hasattr(namespace, name) for name in RULE_NAMES):
                return []  # a layer this module does not know how to record
            layers.append(module)
    return sorted(layers, key=lambda module: module.layer_idx)


def state_rollback_for(model: torch.nn.Module, mode: str = "states") -> StateRollback | None:
    """None when cropping the cache cuts the model back (attention only); a `StateRollback` for
    gated delta-net hybrids; a UserError for other stateful layers."""
    stateful = stateful_layer_types(model)
    if not stateful:
        return None
    layers = delta_rule_layers(model)
    if stateful != {"linear_attention"} or not layers:
        raise UserError(
            f"{type(model).__name__} has recurrent-state layers ({', '.join(sorted(stateful))}) that polyspec "
            "cannot cut back after a rejection: only gated delta-net linear attention (Qwen3.5) is supported"
        )
    return StateRollback(layers, mode=mode)


def stepwise_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    normalize_qk: bool,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The gated delta rule one token at a time, returning the state after every token.

    query, key: [B, T, Hk, Dk]; value: [B, T, Hv, Dv]; g (log decay), beta: [B, T, Hv];
    initial_state: [B, Hv, Dk, Dv] or None (zeros). Returns the output [B, T, Hv, Dv] in the
    input dtype and T float32 states [B, Hv, Dk, Dv]. Per token t, with S the state:
        S <- exp(g_t) S;  S <- S + beta_t k_t (v_t - k_t^T S)^T;  o_t = q_t^T S.
    """
    out_dtype = query.dtype
    heads = value.shape[2]
    if key.shape[2] != heads:  # grouped heads: each key head serves several value heads
        query = query.repeat_interleave(heads // key.shape[2], dim=2)
        key = key.repeat_interleave(heads // key.shape[2], dim=2)
    query, key, value, beta, g = (x.to(torch.float32) for x in (query, key, value, beta, g))
    if normalize_qk:
        query = query * torch.rsqrt((query * query).sum(-1, keepdim=True) + 1e-6)
        key = key * torch.rsqrt((key * key).sum(-1, keepdim=True) + 1e-6)
    query = query / (query.shape[-1] ** 0.5)
    decay = g.exp()
    batch, length, _, key_dim = key.shape
    state = initial_state.to(torch.float32) if initial_state is not None else None
    if state is None:
        state = value.new_zeros(batch, heads, key_dim, value.shape[-1])
    outputs, states = [], []
    for t in range(length):
        k_t = key[:, t].unsqueeze(-1)  # [B, H, Dk, 1]
        state = state * decay[:, t, :, None, None]
        delta = (value[:, t] - (state * k_t).sum(-2)) * beta[:, t, :, None]  # [B, H, Dv]
        state = state + k_t * delta.unsqueeze(-2)
        outputs.append((state * query[:, t].unsqueeze(-1)).sum(-2))
        states.append(state)
    return torch.stack(outputs, dim=1).to(out_dtype), states


class StateRollback:
    """Keeps the recurrent states a `CachedLM` may have to go back to, and restores them.

    Between two rollbacks, `_states[n]` maps each linear-attention layer to its recurrent state
    after the first n tokens, for every n this mechanism can restore directly; `_segments`
    holds the tokens of forwards that can only be re-fed.
    """

    def __init__(self, layers: list[torch.nn.Module], mode: str = "states", step_limit: int = DEFAULT_STEP_LIMIT):
        if mode not in MODES:
            raise UserError(f"unknown rollback mode {mode!r}: use {' or '.join(MODES)}")
        self.layer_ids = [module.layer_idx for module in layers]
        self.namespaces = list({sys.modules[type(module).__module__] for module in layers})
        self.step_limit = step_limit if mode == "states" else 0
        self.mode = mode
        self._states: dict[int, dict[int, torch.Tensor]] = {}
        self._segments: list[tuple[int, list[int]]] = []
        self._calls = 0
        self._start = 0

    def reset(self, cache) -> None:
        # Record from the very first forward, so a rollback into it finds every conv input.
        cache.activate_past_recording()
        self._states, self._segments = {}, []

    @contextmanager
    def recording(self, start: int, tokens: list[int]) -> Iterator[None]:
        """Swap in the recording rule for one forward of `tokens` fed after `start` tokens."""
        self._calls, self._start = 0, start
        saved = [(namespace, name, getattr(namespace, name)) for namespace in self.namespaces for name in RULE_NAMES]
        for namespace, name, original in saved:
            setattr(namespace, name, self._rule(original))
        try:
            yield
        finally:
            for namespace, name, original in saved:
                setattr(namespace, name, original)
        if self._calls != len(self.layer_ids):
            raise RuntimeError(f"recorded {self._calls} gated delta-net calls, expected {len(self.layer_ids)}")
        if len(tokens) > self.step_limit:
            self._segments.append((start, list(tokens)))

    def _rule(self, original: Callable) -> Callable:
        def rule(query, key, value, g, beta, initial_state=None, output_final_state=False, **kwargs):
            layer = self.layer_ids[self._calls]
            self._calls += 1
            length = query.shape[1]
            if length <= self.step_limit:
                normalize = kwargs.get("use_qk_l2norm_in_kernel", False)
                out, states = stepwise_delta_rule(query, key, value, g, beta, initial_state, normalize)
            else:
                out, final = original(
                    query, key, value, g=g, beta=beta, initial_state=initial_state, output_final_state=True, **kwargs
                )
                if final is initial_state:  # never keep a reference to the cache's own tensor
                    final = final.clone()
                states = [final]
            end = self._start + length
            for offset, state in enumerate(states, start=end - len(states) + 1):
                self._states.setdefault(offset, {})[layer] = state
            return out, (states[-1] if output_final_state else None)

        return rule

    def rollback(self, lm: CachedLM, length: int) -> None:
        """Leave `lm` as if only its first `length` tokens had been fed."""
        if length == 0:
            lm.reset()
            return
        if length != lm.length:
            if length not in self._states:
                self._refeed(lm, length)
            else:
                self._restore(lm, length)
        else:
            lm.cache.crop(0)  # trims the conv states recorded since the last rollback
        kept = self._states.get(length)
        self._states = {length: kept} if kept is not None else {}
        self._segments = []

    @torch.inference_mode()  # the cache's tensors were made in inference mode
    def _restore(self, lm: CachedLM, length: int) -> None:
        lm.cache.crop(length - lm.length)
        for layer, state in self._states[length].items():
            lm.cache.layers[layer].recurrent_states[0].copy_(state)
        lm.length = length

    def _refeed(self, lm: CachedLM, length: int) -> None:
        for start, tokens in reversed(self._segments):
            if start < length < start + len(tokens) and (start == 0 or start in self._states):
                if start == 0:
                    lm.reset()
                else:
                    self._restore(lm, start)
                lm.forward(tokens[: length - start], num_logits=1)
                return
        raise ValueError(f"cannot roll back to {length} tokens: it is before the last rollback")
