"""A causal LM fed one chunk at a time whose cache can be cut back after a rejection.

`CachedLM` keeps the cache of every token fed so far; it alone changes that cache and its length
(invariant: the cache holds exactly `length` tokens). Verifying a draft feeds k + 1 tokens in one
forward; when only some are kept, `rollback` asks the model's rollback policy
(`polyspec.state_rollback`) for a plan (crop; restore states, then crop; re-feed) and carries it
out. Sliding-window layers (Gemma 3) keep the states they would drop until the next rollback, so
they too can be cut back once a sequence outgrows the window.

Models that keep states on their own modules rather than in the cache (RecurrentGemma) get their
states swapped in for each forward, so that each CachedLM of one model has its own. A model whose
forward of several tokens after its prompt computes something other than single-token decoding
(RecurrentGemma, ProphetNet, DeepSeek sparse attention's top-k indexer) is fed a token at a time
after its prompt (`ModelCall.stepwise` says why): exact, but a verify call costs a forward per token.

Token trees: `forward(tokens, parents=...)` feeds a tree of candidate tokens in one forward, each
node attending to the whole cached prefix and its own ancestors only, at position cached length +
depth; `keep(indices)` then keeps one root-to-leaf path, gathering its cache entries into place.
Trees need a cache that cropping and gathering cut back exactly (attention layers only).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch

from polyspec.errors import UserError
from polyspec.state_rollback import (
    Crop,
    CropPolicy,
    Plan,
    Refeed,
    Restore,
    RollbackPolicy,
    SnapshotRefeed,
    States,
    policy_for,
)

# Names models give the cache argument of their forward, in the order they are looked for.
CACHE_ARGUMENTS = ("past_key_values", "cache_params", "state")
# Attention implementations that take a custom 4D mask.
TREE_ATTENTION = frozenset({"eager", "sdpa"})
# Fields of a layer that holds both attention KV and a recurrent state which belong to the KV part.
_ATTENTION_FIELDS = frozenset({"keys", "values", "cumulative_length", "is_initialized"})


@dataclass
class _Output:
    """The rows of a forward fed a token at a time, and the cache after the last one."""

    logits: torch.Tensor
    cache: Any = None


def _clone(value: Any) -> Any:
    """A copy of tensors and the containers holding them; anything else is shared."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {key: _clone(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_clone(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_clone(item) for item in value)
    return value


def _copy_object(value: Any) -> Any:
    """A copy of a cache object of any kind: its tensors cloned, one level of attributes deep."""
    if value is None or isinstance(value, (torch.Tensor, dict, list, tuple)):
        return _clone(value)
    copied = copy.copy(value)
    for name, item in vars(value).items():
        setattr(copied, name, _clone(item))
    return copied


def _attention_crop(layer_type: type):
    """The `crop` of a cache layer's attention part (None when it has none)."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    for klass in layer_type.__mro__:
        if issubclass(klass, LinearAttentionCacheLayerMixin):
            continue
        if "crop" in vars(klass):
            return vars(klass)["crop"]
    return None


@functools.cache
def _tracked_cache_class() -> type:
    """transformers' dynamic cache, which can also tell the length of a cache with no attention
    layer (transformers' own asks an attention layer and fails when there is none)."""
    from transformers import DynamicCache
    from transformers.cache_utils import CacheLayerMixin

    class TrackedCache(DynamicCache):
        known_length = 0

        def _has_attention(self) -> bool:
            return any(isinstance(layer, CacheLayerMixin) for layer in self.layers)

        def get_seq_length(self, layer_idx: int = 0) -> int:
            if layer_idx == 0 and self.layers and not self._has_attention():
                return self.known_length
            return super().get_seq_length(layer_idx)

        def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
            if layer_idx == 0 and self.layers and not self._has_attention():
                return self.known_length + query_length, 0
            return super().get_mask_sizes(query_length, layer_idx)

    return TrackedCache


def _module_states(model: torch.nn.Module) -> tuple[tuple[str, str], ...]:
    """Attributes named like states (`*_state`, `*_states`) that modules hold as plain tensors
    (or None before the first forward): not parameters, buffers or submodules."""
    found = []
    for name, module in model.named_modules():
        for attribute, value in vars(module).items():
            if attribute.startswith("_") or not attribute.endswith(("_state", "_states")):
                continue
            if value is None or (isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter)):
                found.append((name, attribute))
    return tuple(found)


# Models whose forward does not take new tokens after cached ones, by class name: why.
REFUSED = {
    "CpmAntForCausalLM": "takes the whole sequence in every cached forward and cuts the cached part off itself: "
    "polyspec feeds only the tokens after the cache",
}
# RoBERTa-style decoders: a tree forward does not give each node its chain's logits (the sweep
# of benchmarks/architectures.py checks every architecture).
NO_TREES = frozenset(
    {"camembert", "data2vec-text", "roberta", "roberta-prelayernorm", "xlm-roberta", "xlm-roberta-xl", "xmod"}
)
# Models whose cached forward takes one token at a time (a prompt aside), by class name.
ONE_TOKEN_AT_A_TIME = {
    "ProphetNetForCausalLM": "its cached forward takes one token at a time",
}


def _stepwise_reason(model: torch.nn.Module, module_states) -> str | None:
    if type(model).__name__ in ONE_TOKEN_AT_A_TIME:
        return ONE_TOKEN_AT_A_TIME[type(model).__name__]
    if module_states:
        return "it keeps states on its modules and takes any forward of several tokens for a prompt"
    if any(isinstance(getattr(module, "index_topk", None), int) for module in model.modules()):
        # DeepSeek sparse attention: transformers' indexer picks each query's top-k keys
        # differently in a forward of several tokens than in single-token decoding
        return "its sparse-attention indexer picks keys differently for several tokens than for one"
    return None


@dataclass(frozen=True)
class ModelCall:
    """How one model's forward takes its cache, positions and logit count."""

    cache_name: str
    positions: bool
    logits_to_keep: bool
    attention_mask: bool
    default_cache: bool  # the model works with transformers' dynamic cache, made here
    # States the model keeps on its own modules rather than in the cache (RecurrentGemma's
    # convolution and recurrence): (submodule name, attribute) pairs. Such a model treats every
    # forward of several tokens as a prompt, so after the first one it is fed a token at a time.
    module_states: tuple[tuple[str, str], ...] = ()
    # Why a forward of several tokens after the first one is not what single-token decoding computes
    # (None: it is). Such a model is fed a token at a time after its prompt: exact, but a verify
    # call then costs as many forwards as it has tokens.
    stepwise: str | None = None

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelCall:
        name = type(model).__name__
        config = model.config
        if getattr(config, "is_encoder_decoder", False):
            raise UserError(f"{name} is an encoder-decoder model: polyspec drives decoder-only causal LMs")
        if name in REFUSED:
            raise UserError(f"{name} {REFUSED[name]}")
        params = inspect.signature(model.forward).parameters
        cache_name = next((arg for arg in CACHE_ARGUMENTS if arg in params), None)
        if cache_name is None:
            raise UserError(f"{name} takes no cache in its forward: polyspec needs one to decode incrementally")
        supports_default = getattr(model, "_supports_default_dynamic_cache", lambda: True)()
        module_states = _module_states(model) if getattr(model, "_is_stateful", False) else ()
        return cls(
            cache_name=cache_name,
            positions="position_ids" in params,
            logits_to_keep="logits_to_keep" in params,
            attention_mask="attention_mask" in params,
            default_cache=cache_name != "state" and supports_default,
            module_states=module_states,
            stepwise=_stepwise_reason(model, module_states),
        )

    def new_cache(self, model: torch.nn.Module):
        if not self.default_cache and not self.module_states:
            return None
        return _tracked_cache_class()(config=model.config.get_text_config(decoder=True))


class CachedLM:
    """Feeds tokens to a causal LM one chunk at a time and can cut its cache back.

    `rollback` is a mode name of `polyspec.state_rollback.policy_for` ('auto' picks one from the
    model) or a policy object.
    """

    def __init__(self, model: torch.nn.Module, rollback: str | RollbackPolicy = "auto") -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.call = ModelCall.of(model)
        self.policy = policy_for(model, rollback) if isinstance(rollback, str) else rollback
        self._auto = rollback == "auto"
        self._cache = None
        self._module_values: dict[tuple[str, str], Any] = {}
        self._length = 0
        self._fed = False
        self._tree: tuple[int, list[int]] | None = None  # (start, parents) of the last forward, a tree

    @property
    def length(self) -> int:
        """How many tokens the cache holds."""
        return self._length

    @property
    def cache(self):
        return self._cache

    def reset(self) -> None:
        # states held on the model's modules: this object's own values, swapped in for each forward
        # (another CachedLM of the same model has its own)
        self._module_values = {key: None for key in self.call.module_states}
        self._cache = self.call.new_cache(self.model)
        self._length = 0
        self._fed = False
        self._tree = None
        self.policy.begin()

    @torch.inference_mode()
    def forward(
        self, tokens: list[int], num_logits: int | None = None, parents: list[int] | None = None
    ) -> torch.Tensor:
        """Feed `tokens` after the cached ones; returns logits [n, V] for the last `num_logits`
        positions (all by default).

        With `parents` (one per token: the index of its parent in this chunk, -1 for a node that
        follows the last cached token; parents[i] < i), the tokens are a tree fed in one forward:
        each node sees the cached prefix and its own ancestors, at position length + depth. Then
        `keep` says which root-to-leaf path stays.
        """
        if not tokens:
            raise ValueError("nothing to feed")
        if parents is None:
            self._tree = None
            return self._feed(list(tokens), num_logits)
        return self._feed_tree(list(tokens), list(parents), num_logits)

    def _feed(self, tokens: list[int], num_logits: int | None, mask=None, positions=None) -> torch.Tensor:
        start = self._length
        if start == 0 and self.policy.conv_past and self._cache is not None:
            self._record_past()  # from the very first forward: a rollback into it finds every conv input
        if hasattr(self._cache, "known_length"):
            self._cache.known_length = start
        input_ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        kwargs = {"input_ids": input_ids, self.call.cache_name: self._cache, "use_cache": True}
        if self.call.positions:
            if positions is None:
                positions = torch.arange(start, start + len(tokens), device=self.device)
            kwargs["position_ids"] = positions.unsqueeze(0)
        if self.call.logits_to_keep:
            kwargs["logits_to_keep"] = num_logits or 0
        if mask is not None:
            kwargs["attention_mask"] = mask
        with self.policy.recording(start, tokens, self._snapshot), self._modules_swapped():
            if self.call.stepwise and start > 0 and len(tokens) > 1 and mask is None:
                rows = []  # one token at a time: the model takes a wider forward for a prompt
                for offset in range(len(tokens)):
                    if hasattr(kwargs[self.call.cache_name], "known_length"):
                        kwargs[self.call.cache_name].known_length = start + offset
                    kwargs["input_ids"] = input_ids[:, offset : offset + 1]
                    if self.call.positions:
                        kwargs["position_ids"] = positions[offset : offset + 1].unsqueeze(0)
                    if self.call.logits_to_keep:
                        kwargs["logits_to_keep"] = 0
                    out = self.model(**kwargs)
                    rows.append(out.logits)
                    if self.call.cache_name in out and out[self.call.cache_name] is not None:
                        kwargs[self.call.cache_name] = out[self.call.cache_name]
                out = _Output(logits=torch.cat(rows, dim=1), cache=getattr(out, self.call.cache_name, None))
            else:
                out = self.model(**kwargs)
        cache = out.cache if isinstance(out, _Output) else getattr(out, self.call.cache_name, None)
        if cache is None and self.call.module_states and self._cache is not None:
            cache = self._cache  # the attention layers' cache, updated in place; the rest is on the modules
        if cache is None:
            name = type(self.model).__name__
            raise UserError(f"{name} returned no cache: polyspec needs one to decode incrementally")
        self._cache = cache
        self._length += len(tokens)
        if not self._fed:
            # Only after the first forward do all layers exist; from then on sliding-window layers
            # keep what they would drop until a rollback says how much is needed.
            self._fed = True
            self._record_past()
            if self._auto and isinstance(self.policy, CropPolicy) and self._has_states():
                self.policy = SnapshotRefeed()  # the cache holds more than cropping can cut back
        logits = out.logits[0]
        return logits[-num_logits:] if num_logits else logits

    # Token trees.

    def tree_support(self) -> str | None:
        """Why this model cannot take token trees (None: it can)."""
        name = type(self.model).__name__
        if not self.policy.supports_trees:
            return f"{name} carries recurrent states: polyspec verifies chains only on it, not token trees"
        if self.call.stepwise:
            return f"{name} is fed a token at a time ({self.call.stepwise}): polyspec verifies chains only on it"
        if getattr(self.model.config, "model_type", None) in NO_TREES:
            return f"{name} does not give tree nodes their own chain's logits: polyspec verifies chains only on it"
        if not (self.call.positions and self.call.attention_mask):
            return f"{name} takes no position ids or attention mask: polyspec cannot feed it token trees"
        implementation = getattr(self.model.config, "_attn_implementation", None) or "eager"
        if implementation not in TREE_ATTENTION:
            return f"{name} runs {implementation} attention, which takes no tree mask: use eager or sdpa"
        layer_types = getattr(self.model.config.get_text_config(decoder=True), "layer_types", None) or []
        unusual = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
        if unusual:
            return f"{name} has {', '.join(unusual)} layers: polyspec feeds token trees to full and sliding attention"
        return None

    def _feed_tree(self, tokens: list[int], parents: list[int], num_logits: int | None) -> torch.Tensor:
        reason = self.tree_support()
        if reason is not None:
            raise UserError(reason)
        if len(parents) != len(tokens):
            raise ValueError(f"{len(tokens)} tokens but {len(parents)} parents")
        depths: list[int] = []
        for i, parent in enumerate(parents):
            if not -1 <= parent < i:
                raise ValueError(f"node {i} has parent {parent}: parents must come before their children")
            depths.append(0 if parent == -1 else depths[parent] + 1)
        if self._cache is None:
            self.reset()
        self._record_past()  # sliding layers keep every node until `keep` gathers the path
        start = self._length
        mask = self._tree_mask(parents, depths)
        positions = torch.tensor(depths, dtype=torch.long, device=self.device) + start
        logits = self._feed(tokens, num_logits, mask=mask, positions=positions)
        self._tree = (start, parents)
        return logits

    def _tree_mask(self, parents: list[int], depths: list[int]):
        """A 4D float mask (0: seen, dtype minimum: hidden) per kind of attention layer, as the
        model takes it: one tensor when all its layers are alike, else one per layer type."""
        from transformers.cache_utils import DummyLayer, DynamicSlidingWindowLayer

        n, start = len(parents), self._length
        ancestors = torch.zeros(n, n, dtype=torch.bool)
        for i, parent in enumerate(parents):
            if parent >= 0:
                ancestors[i] = ancestors[parent]
            ancestors[i, i] = True
        ancestors = ancestors.to(self.device)
        depth = torch.tensor(depths, device=self.device)
        dtype = self.model.dtype
        hidden = torch.finfo(dtype).min

        def build(layer) -> torch.Tensor:
            window = layer.sliding_window if isinstance(layer, DynamicSlidingWindowLayer) else None
            kv_length, kv_offset = layer.get_mask_sizes(n) if layer is not None else (start + n, 0)
            column = torch.arange(kv_offset, kv_offset + kv_length, device=self.device)
            seen = torch.zeros(n, kv_length, dtype=torch.bool, device=self.device)
            prefix = column < start
            seen[:, prefix] = True
            seen[:, -n:] = ancestors
            if window is not None:  # a node at position start + d sees the last `window` positions
                logical = torch.where(prefix, column, start + depth[(column - start).clamp(min=0, max=n - 1)])
                seen &= logical[None, :] > (start + depth)[:, None] - window
            mask = torch.zeros(n, kv_length, dtype=dtype, device=self.device).masked_fill_(~seen, hidden)
            return mask[None, None]

        layers = self._layers()
        kinds: list[object] = []
        masks: dict[object, torch.Tensor] = {}
        for layer in layers:
            if isinstance(layer, DummyLayer):
                kinds.append(None)
                continue
            kind = layer.sliding_window if isinstance(layer, DynamicSlidingWindowLayer) else "full"
            kinds.append(kind)
            if kind not in masks:
                masks[kind] = build(layer)
        if not masks:
            return build(None)
        if len(masks) == 1:
            return next(iter(masks.values()))
        layer_types = self.model.config.get_text_config(decoder=True).layer_types
        return {name: masks[kind] for name, kind in zip(layer_types, kinds, strict=True) if kind is not None}

    @torch.inference_mode()
    def keep(self, indices: list[int]) -> None:
        """After a tree forward, keep only the nodes at `indices` (a root-to-leaf path: ascending
        chunk indices starting with 0), gathering their cache entries into place; the cache then
        holds exactly its length before the tree plus len(indices) tokens."""
        from transformers.cache_utils import DummyLayer, DynamicIndexedLayer, DynamicSlidingWindowLayer

        if self._tree is None:
            raise ValueError("keep follows a tree forward")
        start, parents = self._tree
        indices = list(indices)
        if not indices or indices[0] != 0:
            raise ValueError(f"a kept path starts at node 0, got {indices}")
        for before, node in zip([-1, *indices], indices, strict=False):
            if not 0 <= node < len(parents) or parents[node] != before:
                raise ValueError(f"nodes {indices} are not a root-to-leaf path of the tree")
        n, kept = len(parents), len(indices)
        self._tree = None
        if indices == list(range(kept)):  # already in place
            self._cut(start + kept)
            self.policy.settled(start + kept)
            return
        index = torch.tensor(indices, dtype=torch.long, device=self.device)

        def gather(tensor: torch.Tensor, dim: int) -> torch.Tensor:
            head = tensor.shape[dim] - n
            return torch.cat([tensor.narrow(dim, 0, head), tensor.narrow(dim, head, n).index_select(dim, index)], dim)

        for layer in self._layers():
            if isinstance(layer, DummyLayer) or not layer.is_initialized or layer.keys is None:
                continue
            layer.keys, layer.values = gather(layer.keys, -2), gather(layer.values, -2)
            if isinstance(layer, DynamicIndexedLayer):
                if layer.is_indexer_initialized and layer.indexer_keys.numel():
                    layer.indexer_keys = gather(layer.indexer_keys, 1)
                if layer.indexer_position_ids is not None:
                    layer.indexer_position_ids = gather(layer.indexer_position_ids, -1)
            if isinstance(layer, DynamicSlidingWindowLayer):
                layer.cumulative_length -= n - kept
        self._cut(self._length)  # trims the sliding windows
        self._length = start + kept
        self.policy.settled(start + kept)

    def rollback(self, length: int) -> None:
        """Leave the cache as if only its first `length` tokens had been fed (also trims sliding
        windows and recorded convolution inputs)."""
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot roll back to {length} tokens: only {self._length} cached")
        if not self._fed:  # nothing fed yet
            return
        if self._tree is not None:
            start, parents = self._tree
            if any(parents[i] != i - 1 for i in range(length - start)):
                raise ValueError("after a tree forward, keep a path with `keep`; rollback cuts back chains")
            self._tree = None
        if length == 0:
            self.reset()
            return
        with torch.inference_mode():  # the cache's tensors were made in inference mode
            self._carry_out(self.policy.plan(self._length, length))
        self.policy.settled(length)

    def _carry_out(self, plan: Plan) -> None:
        if isinstance(plan, Crop):
            self._cut(plan.length)
        elif isinstance(plan, Restore):
            self._restore(plan)
        elif isinstance(plan, Refeed):
            if plan.base is None:
                self.reset()
            else:
                self._restore(plan.base)
            if plan.tokens:
                self._feed(list(plan.tokens), num_logits=1)
        else:
            raise TypeError(f"unknown rollback plan {plan!r}")

    # The cache itself: what only this class reads and writes.

    def _layers(self) -> list:
        from transformers.cache_utils import Cache

        return list(self._cache.layers) if isinstance(self._cache, Cache) else []

    def _record_past(self) -> None:
        from transformers.cache_utils import DynamicSlidingWindowLayer, LinearAttentionCacheLayerMixin

        for layer in self._layers():
            if not hasattr(layer, "activate_past_recording"):
                continue
            conv_only = isinstance(layer, LinearAttentionCacheLayerMixin) and not isinstance(
                layer, DynamicSlidingWindowLayer
            )
            if conv_only and not self.policy.conv_past:
                continue  # its states are copied and restored instead
            layer.activate_past_recording()

    @staticmethod
    def _kind(layer) -> str:
        """'linear' (a recurrent or convolution state), 'attention' (cut back by cropping) or
        'other' (copied whole)."""
        from transformers.cache_utils import (
            DummyLayer,
            DynamicIndexedLayer,
            DynamicLayer,
            DynamicSlidingWindowLayer,
            LinearAttentionCacheLayerMixin,
        )

        if isinstance(layer, LinearAttentionCacheLayerMixin):
            return "linear"
        if type(layer) in (DynamicLayer, DynamicSlidingWindowLayer, DynamicIndexedLayer, DummyLayer):
            return "attention"
        return "other"

    @contextlib.contextmanager
    def _modules_swapped(self):
        """This object's module-held states in the model's modules for the length of a forward."""
        if not self.call.module_states:
            yield
            return
        modules = {key: self.model.get_submodule(key[0]) for key in self.call.module_states}
        for key, value in self._module_values.items():
            setattr(modules[key], key[1], value)
        try:
            yield
        finally:
            for key, module in modules.items():
                self._module_values[key] = getattr(module, key[1])
                setattr(module, key[1], None)

    def _has_states(self) -> bool:
        return self._snapshot() is not None

    def _snapshot(self) -> States | None:
        """A copy of everything in the cache that cropping cannot cut back; None when there is nothing."""
        from transformers.cache_utils import Cache

        cache = self._cache
        if cache is None:
            return None
        if not isinstance(cache, Cache):
            return States(whole=_copy_object(cache))
        modules: dict[str, dict[str, Any]] = {}
        for (name, attribute), value in self._module_values.items():
            modules.setdefault(name, {})[attribute] = _clone(value)
        layers = {}
        for index, layer in enumerate(cache.layers):
            kind = self._kind(layer)
            if kind == "linear":
                layers[index] = {k: _clone(v) for k, v in vars(layer).items() if k not in _ATTENTION_FIELDS}
            elif kind == "other":
                layers[index] = {k: _clone(v) for k, v in vars(layer).items()}
        base = {"layers", "layer_class_to_replicate", "offloading", "only_non_sliding", "prefetch_stream"}
        extras = {k: _clone(v) for k, v in vars(cache).items() if k not in base and k != "known_length"}
        return States(layers=layers, cache=extras, modules=modules) if layers or extras or modules else None

    def _cut(self, length: int) -> None:
        """Drop the cache's entries past `length` in every layer that cropping cuts back."""
        from transformers.cache_utils import LinearAttentionCacheLayerMixin

        remove = self._length - length
        layers = self._layers()
        if not layers and remove:
            raise RuntimeError(f"{type(self._cache).__name__} cannot be cropped")
        for layer in layers:
            if self._kind(layer) == "other":
                continue  # restored whole from a copy
            linear = isinstance(layer, LinearAttentionCacheLayerMixin)
            if linear and layer.record_past and any(layer.is_conv_states_initialized.values()):
                LinearAttentionCacheLayerMixin.crop(layer, -remove)
            crop = _attention_crop(type(layer))
            if crop is not None:
                crop(layer, -remove)
        self._length = length

    def _restore(self, plan: Restore) -> None:
        states = plan.states
        if states.has_whole:
            self._cache = _copy_object(states.whole)
            self._length = plan.length
            return
        self._cut(plan.length)
        layers = self._layers()
        for index, fields in states.layers.items():
            layer = layers[index]
            for name, value in fields.items():
                current = getattr(layer, name, None)
                if isinstance(value, dict) and isinstance(current, dict):
                    for key, item in value.items():
                        current[key] = _clone(item)
                else:
                    setattr(layer, name, _clone(value))
        for name, value in states.cache.items():
            setattr(self._cache, name, _clone(value))
        for name, fields in states.modules.items():
            for attribute, value in fields.items():
                self._module_values[name, attribute] = _clone(value)
