"""A drafter's output layer over a reduced vocabulary, returning rows over the full one.

`ReducedHead` computes logits for the kept ids only and scatters them into a row over the full
vocabulary with -inf elsewhere: everything downstream (the drafter's logits processing,
`generate`) sees ordinary full rows whose probabilities are zero outside the set.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from polyspec.errors import UserError


def text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


class ReducedHead(nn.Module):
    """Output layer over `kept_ids` only; `forward` returns full-vocabulary rows.

    weight:   [K, hidden] rows of the verifier's output matrix for the kept ids.
    kept_ids: [K] sorted verifier ids.
    softcap:  the model's final logit soft-capping, applied here to the kept logits so that
              the ids outside stay at -inf (capping -inf would give them mass).
    """

    def __init__(self, weight: torch.Tensor, kept_ids: torch.Tensor, vocab_size: int, softcap: float | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.register_buffer("kept_ids", kept_ids.long(), persistent=False)
        self.vocab_size = vocab_size
        self.softcap = softcap

    def reduced(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> [..., K] logits over the kept ids."""
        logits = nn.functional.linear(hidden, self.weight)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> [..., vocab] with -inf outside the kept ids."""
        reduced = self.reduced(hidden)
        full = reduced.new_full((*reduced.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.kept_ids] = reduced
        return full


def attach_reduced_head(model: nn.Module, kept_ids: Sequence[int] | torch.Tensor, weight: torch.Tensor | None = None):
    """Give `model` a `ReducedHead` over `kept_ids`: initialised from the rows of its output
    matrix, or `weight` ([K, hidden], e.g. a trained head). The full head is kept aside (not a
    submodule) so the checkpoint can still be written in the stock transformers layout."""
    full = model.get_output_embeddings()
    vocab = full.weight.shape[0]
    kept = torch.as_tensor(kept_ids, dtype=torch.long)
    if kept.numel() == 0 or int(kept.min()) < 0 or int(kept.max()) >= vocab:
        raise UserError(f"kept vocabulary ids must lie in [0, {vocab})")
    if not bool((kept[1:] > kept[:-1]).all()):
        raise UserError("kept vocabulary ids must be sorted and distinct")
    if weight is None:
        weight = full.weight.detach()[kept.to(full.weight.device)].clone()
    elif tuple(weight.shape) != (kept.numel(), full.weight.shape[1]):
        raise UserError(f"reduced head of shape {tuple(weight.shape)} does not fit {kept.numel()} kept ids")
    config = text_config(model.config)
    softcap = getattr(config, "final_logit_softcapping", None)
    head = ReducedHead(weight.to(full.weight.dtype), kept, vocab, softcap).to(full.weight.device)
    model.__dict__["_polyspec_full_head"] = full  # outside the module tree: not trained, not saved twice
    model.set_output_embeddings(head)
    config.final_logit_softcapping = None  # ReducedHead caps its own logits
    return head


def reduced_head(model: nn.Module) -> ReducedHead | None:
    head = model.get_output_embeddings()
    return head if isinstance(head, ReducedHead) else None


@contextlib.contextmanager
def full_head_in_place(model: nn.Module) -> Iterator[None]:
    """The stock model (full head, original soft-capping) for the duration, e.g. to save it."""
    head = reduced_head(model)
    if head is None:
        yield
        return
    config = text_config(model.config)
    model.set_output_embeddings(model.__dict__["_polyspec_full_head"])
    config.final_logit_softcapping = head.softcap
    try:
        yield
    finally:
        model.set_output_embeddings(head)
        config.final_logit_softcapping = None
