"""Per-position recurrent states for gated delta-net layers (Qwen3.5, Qwen3-Next linear attention).

A recurrent state is one tensor that every token fed has updated, so it cannot be cut back like
a KV cache. For each forward this policy keeps the recurrent state of every linear-attention layer
after each of its positions, and going back to a kept position copies those states back, while a
crop cuts back the convolution states (which record every input since the last cut) and the
attention KV.

Forwards of at most `step_limit` tokens (a verification: the pending token plus the draft) run
the recurrence one token at a time, the rule single-token decoding uses, and keep the state after
every token: tensors the recurrence creates anyway, so keeping them copies nothing. Wider forwards
(a prompt) use the model's chunked rule, keep only their final state, and are re-fed in the rare
case a rollback lands inside one.

The recurrence is reached through the module-level functions the modeling code calls by name
(`torch_chunk_gated_delta_rule`, `torch_recurrent_gated_delta_rule`); they are swapped only for
the duration of one forward of the model being recorded.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch

from polyspec.state_rollback.plans import Crop, Plan, Refeed, Restore, States

RULE_NAMES = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
# Wide enough for any verification (gamma + 1 tokens); narrow enough that a prompt never runs
# token by token.
DEFAULT_STEP_LIMIT = 16


def delta_rule_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's gated delta-net layers, in execution order (each has a `layer_idx`); empty when
    one of them lives in a module without both rules to swap."""
    layers = []
    for module in model.modules():
        if hasattr(module, "layer_idx") and type(module).__name__.endswith("GatedDeltaNet"):
            namespace = sys.modules.get(type(module).__module__)
            if namespace is None or not all(hasattr(namespace, name) for name in RULE_NAMES):
                return []
            layers.append(module)
    return sorted(layers, key=lambda module: module.layer_idx)


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


class DeltaRuleStates:
    """Between two rollbacks, `_states[n]` maps each linear-attention layer to its recurrent state
    after the first n tokens, for every n this policy can restore directly; `_segments` holds the
    forwards that can only be re-fed."""

    name = "states"
    conv_past = True
    supports_trees = False

    def __init__(self, layers: list[torch.nn.Module], step_limit: int = DEFAULT_STEP_LIMIT) -> None:
        self.layer_ids = [module.layer_idx for module in layers]
        self.namespaces = list({sys.modules[type(module).__module__] for module in layers})
        self.step_limit = step_limit
        self._states: dict[int, dict[int, torch.Tensor]] = {}
        self._segments: list[tuple[int, tuple[int, ...]]] = []
        self._calls = 0
        self._start = 0

    def begin(self) -> None:
        self._states, self._segments = {}, []

    @contextmanager
    def recording(self, start: int, tokens: Sequence[int], snapshot: Callable[[], States | None]) -> Iterator[None]:
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
            self._segments.append((start, tuple(tokens)))

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

    def _restore(self, length: int) -> Restore:
        layers = {layer: {"recurrent_states": {0: state}} for layer, state in self._states[length].items()}
        return Restore(length, States(layers=layers))

    def plan(self, cached: int, length: int) -> Plan:
        if length == cached:
            return Crop(length)  # trims the convolution inputs recorded since the last cut
        if length in self._states:
            return self._restore(length)
        for start, tokens in reversed(self._segments):
            if start < length < start + len(tokens) and (start == 0 or start in self._states):
                base = self._restore(start) if start else None
                return Refeed(base, tokens[: length - start])
        raise ValueError(f"cannot roll back to {length} tokens: it is before the last rollback")

    def settled(self, length: int) -> None:
        kept = self._states.get(length)
        self._states = {length: kept} if kept is not None else {}
        self._segments = []
