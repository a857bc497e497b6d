"""A causal LM fed one chunk at a time whose cache can be cut back after a rejection.

`CachedLM` keeps the cache of every token fed so far. Verifying a draft feeds k + 1 tokens in
one forward; when only some are kept, `rollback` cuts every layer back to the kept prefix
instead of recomputing it. Sliding-window layers (Gemma 3) keep the states they would drop
until the next rollback, so they too can be cut back once a sequence outgrows the window.
Recurrent states (Qwen3.5's linear attention) are restored by `polyspec.state_rollback`.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from polyspec.state_rollback import state_rollback_for


class CachedLM:
    """Feeds tokens to a causal LM one chunk at a time and can cut its cache back.

    Invariant: the cache holds exactly `self.length` tokens.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.cache = None
        self.length = 0
        self.states = state_rollback_for(model)  # None unless some layers carry a recurrent state

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        self.length = 0
        self._recording = False
        if self.states is not None:
            self.states.reset(self.cache)
            self._recording = True

    @torch.inference_mode()
    def forward(self, tokens: list[int], num_logits: int | None = None) -> torch.Tensor:
        """Feed `tokens` after the cached ones; returns logits [n, V] for the last `num_logits`
        positions (all by default)."""
        input_ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        positions = torch.arange(self.length, self.length + len(tokens), device=self.device)
        with self.states.recording(self.length, tokens) if self.states is not None else nullcontext():
            out = self.model(
                input_ids=input_ids,
                past_key_values=self.cache,
                position_ids=positions.unsqueeze(0),
                use_cache=True,
                logits_to_keep=num_logits or 0,
            )
        self.length += len(tokens)
        if not self._recording:
            # Only after the first forward do all layers exist; from then on sliding-window
            # layers keep what they would drop until `rollback` says how much is needed.
            self.cache.activate_past_recording()
            self._recording = True
        return out.logits[0]

    def rollback(self, length: int) -> None:
        """Cut the cache back to its first `length` tokens (also trims sliding windows)."""
        if length > self.length:
            raise ValueError(f"cannot roll back to {length} tokens: only {self.length} cached")
        if not self._recording:  # nothing fed yet
            return
        if self.states is not None:
            self.states.rollback(self, length)
            return
        self.cache.crop(length - self.length)
        self.length = length
