"""Distillation losses: forward KL, reverse KL and total variation between verifier and drafter.

The verifier's distribution p is known either in full or as its top-k log-probabilities; the
drafter's q lives on its own output vocabulary, which may be a subset K of the verifier's. Both
are compared on the same *buckets*:

- one bucket per known target token the drafter can emit (the set J = top-k ∩ K, or all of K);
- one "rest" bucket for the drafter's other tokens (K \\ J), holding the target mass outside
  its top-k (1 - sum of the top-k probabilities). Without it a drafter could move all its mass
  off the top-k at no cost.

Target mass the drafter can never emit (top-k tokens outside K, or everything outside K for a
full target) is dropped and the target renormalised: for all three divergences the best
drafter on K is then still p conditioned on K, which is what rejection sampling rewards
(acceptance = sum of min(p, q), maximal for any q >= p on K).

Closed forms on the bucket distributions p', q' (both sum to 1):
  fkl = sum p' (log p' - log q')      rkl = sum q' (log q' - log p')      tvd = 1/2 sum |p' - q'|
With a full target and a full-vocabulary drafter these are exactly KL(p||q), KL(q||p), TV(p, q).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSSES = ("fkl", "rkl", "tvd")
# Target probabilities below e^-30 count as e^-30 in reverse KL, so that a drafter that puts
# some mass where the (renormalised) top-k target has none gets a large but finite loss.
LOG_FLOOR = -30.0


@dataclass
class Target:
    """What the verifier says about each trained position.

    logprobs: [N, k] log-probabilities of the verifier's top-k tokens (over its full
              vocabulary, not renormalised), or [N, D] dense log-probabilities, one per
              drafter column, when `index` is None.
    index:    [N, k] the drafter column of each top-k token, -1 where the drafter cannot
              emit it; None for a dense target.
    """

    logprobs: torch.Tensor
    index: torch.Tensor | None = None


def _widen(values: torch.Tensor) -> torch.Tensor:
    """Half precision is too coarse for log-probabilities; float64 stays float64."""
    return values if values.dtype == torch.float64 else values.float()


def buckets(draft_logits: torch.Tensor, target: Target) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """draft_logits: [N, D]. Returns log p' [N, m], log q' [N, m] (entries may be -inf) and a
    [N] mask of the rows that carry information (some target mass the drafter can emit)."""
    draft_logits = _widen(draft_logits)
    log_q_all = torch.log_softmax(draft_logits, dim=-1)
    if target.index is None:
        log_p = torch.log_softmax(_widen(target.logprobs), dim=-1)  # renormalised over K
        return log_p, log_q_all, torch.isfinite(log_p).any(dim=-1)
    index, logprobs = target.index, _widen(target.logprobs)
    valid = index >= 0
    column = index.clamp(min=0)
    minus_inf = torch.tensor(float("-inf"), dtype=draft_logits.dtype, device=draft_logits.device)
    log_q_known = torch.where(valid, log_q_all.gather(1, column), minus_inf)
    # Drafter columns covered by the known target tokens; the others make the rest bucket.
    covered = torch.zeros_like(draft_logits, dtype=torch.int32).scatter_add_(1, column, valid.int()) > 0
    has_rest = ~covered.all(dim=-1)
    rest_logits = torch.where(has_rest[:, None], draft_logits.masked_fill(covered, float("-inf")), 0.0)
    log_q_rest = torch.where(
        has_rest, torch.logsumexp(rest_logits, dim=-1) - torch.logsumexp(draft_logits, dim=-1), minus_inf
    )
    p_rest = torch.where(has_rest, (1.0 - logprobs.exp().sum(dim=-1)).clamp(min=0.0), 0.0)
    log_p_known = torch.where(valid, logprobs, minus_inf)
    log_p = torch.cat([log_p_known, p_rest.log()[:, None]], dim=-1)
    norm = torch.logsumexp(log_p, dim=-1, keepdim=True)
    informative = torch.isfinite(norm[:, 0])
    log_p = log_p - torch.where(informative[:, None], norm, 0.0)
    log_q = torch.cat([log_q_known, log_q_rest[:, None]], dim=-1)
    return log_p, log_q, informative


def divergence(kind: str, log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """[N] divergence of each row, from bucket log-probabilities (-inf for empty buckets)."""
    p, q = log_p.exp(), log_q.exp()
    # Zero-mass entries contribute nothing; replacing their -inf keeps gradients free of NaN.
    safe_log_p = torch.where(p > 0, log_p, 0.0)
    safe_log_q = torch.where(q > 0, log_q, 0.0)
    if kind == "fkl":
        return torch.where(p > 0, p * (safe_log_p - safe_log_q), 0.0).sum(dim=-1)
    if kind == "rkl":
        floored = torch.where(p > 0, log_p, LOG_FLOOR).clamp(min=LOG_FLOOR)
        return torch.where(q > 0, q * (safe_log_q - floored), 0.0).sum(dim=-1)
    if kind == "tvd":
        return 0.5 * (p - q).abs().sum(dim=-1)
    raise ValueError(f"unknown loss {kind!r}: use {', '.join(LOSSES)}")


def distill_loss(kind: str, draft_logits: torch.Tensor, target: Target) -> torch.Tensor:
    """Mean divergence over the rows that carry information (0 with a gradient when none do)."""
    log_p, log_q, informative = buckets(draft_logits, target)
    per_row = divergence(kind, log_p, log_q)
    weight = informative.float()
    return (per_row * weight).sum() / weight.sum().clamp(min=1.0)


def top1_agreement(draft_logits: torch.Tensor, draft_ids: torch.Tensor | None, target_top1: torch.Tensor) -> float:
    """Share of rows whose drafter argmax (as a verifier id) is the verifier's argmax.

    draft_ids: [D] verifier id of each drafter column, None when they coincide.
    target_top1: [N] the verifier's argmax id per row."""
    if target_top1.numel() == 0:
        return 0.0
    best = draft_logits.argmax(dim=-1)
    if draft_ids is not None:
        best = draft_ids[best]
    return float((best == target_top1).float().mean())
