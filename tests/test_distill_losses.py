"""Distillation losses against their closed forms, for full and top-k targets and for drafters
with a reduced vocabulary."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from polyspec.distill.losses import LOSSES, Target, distill_loss, top1_agreement


def logits(rows: int, vocab: int, seed: int, scale: float = 2.0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


def closed_form(kind: str, p: np.ndarray, q: np.ndarray) -> float:
    """Mean over rows of KL(p||q), KL(q||p) or TV(p, q), straight from the definitions."""
    if kind == "fkl":
        return float(np.mean([stats.entropy(a, b) for a, b in zip(p, q, strict=True)]))
    if kind == "rkl":
        return float(np.mean([stats.entropy(b, a) for a, b in zip(p, q, strict=True)]))
    return float(np.mean(0.5 * np.abs(p - q).sum(axis=1)))


def as_float(value: torch.Tensor) -> float:
    return float(value.detach())


@pytest.mark.parametrize("kind", LOSSES)
def test_full_target_and_drafter_give_the_textbook_divergences(kind):
    target_logits, draft_logits = logits(6, 12, 0), logits(6, 12, 1)
    p, q = torch.softmax(target_logits, -1).numpy(), torch.softmax(draft_logits, -1).numpy()
    loss = distill_loss(kind, draft_logits, Target(torch.log_softmax(target_logits, -1)))
    assert as_float(loss) == pytest.approx(closed_form(kind, p, q), rel=1e-5)


def test_gradients_match_their_closed_forms():
    target_logits = logits(4, 9, 2)
    p = torch.softmax(target_logits, -1)
    log_p = torch.log_softmax(target_logits, -1)
    for kind in ("fkl", "rkl"):
        z = logits(4, 9, 3).requires_grad_(True)
        distill_loss(kind, z, Target(log_p)).backward()
        q, log_q = torch.softmax(z.detach(), -1), torch.log_softmax(z.detach(), -1)
        if kind == "fkl":  # d KL(p||q) / dz = q - p
            expected = q - p
        else:  # d KL(q||p) / dz = q (log q - log p - KL(q||p))
            kl = (q * (log_q - log_p)).sum(-1, keepdim=True)
            expected = q * (log_q - log_p - kl)
        torch.testing.assert_close(z.grad, expected / 4, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("kind", LOSSES)
def test_top_k_target_compares_the_top_k_and_the_rest(kind):
    vocab, k = 12, 4
    target_logits, draft_logits = logits(5, vocab, 4), logits(5, vocab, 5)
    log_p_full = torch.log_softmax(target_logits, -1)
    top = log_p_full.topk(k, dim=-1)
    loss = distill_loss(kind, draft_logits, Target(top.values, top.indices))
    p_full, q_full = log_p_full.exp().numpy(), torch.softmax(draft_logits, -1).numpy()
    index = top.indices.numpy()
    p = np.concatenate(
        [np.take_along_axis(p_full, index, 1), 1 - np.take_along_axis(p_full, index, 1).sum(1, keepdims=True)], 1
    )
    q = np.concatenate(
        [np.take_along_axis(q_full, index, 1), 1 - np.take_along_axis(q_full, index, 1).sum(1, keepdims=True)], 1
    )
    assert as_float(loss) == pytest.approx(closed_form(kind, p, q), rel=1e-5)


@pytest.mark.parametrize("kind", LOSSES)
def test_top_k_over_the_whole_vocabulary_equals_the_full_target(kind):
    target_logits, draft_logits = logits(3, 10, 6), logits(3, 10, 7)
    log_p = torch.log_softmax(target_logits, -1)
    top = log_p.topk(10, dim=-1)
    full = distill_loss(kind, draft_logits, Target(log_p))
    assert as_float(distill_loss(kind, draft_logits, Target(top.values, top.indices))) == pytest.approx(
        as_float(full), rel=1e-6, abs=1e-9
    )


@pytest.mark.parametrize("kind", LOSSES)
def test_reduced_drafter_is_compared_with_the_target_conditioned_on_its_vocabulary(kind):
    kept = torch.tensor([0, 2, 3, 7, 9])
    target_logits, draft_logits = logits(4, 12, 8), logits(4, len(kept), 9)
    log_p = torch.log_softmax(target_logits, -1)
    loss = distill_loss(kind, draft_logits, Target(log_p[:, kept]))
    p = torch.softmax(target_logits[:, kept], -1).numpy()  # p restricted to the kept ids, renormalised
    q = torch.softmax(draft_logits, -1).numpy()
    assert as_float(loss) == pytest.approx(closed_form(kind, p, q), rel=1e-5)


@pytest.mark.parametrize("kind", LOSSES)
def test_reduced_drafter_with_top_k_drops_the_mass_it_cannot_emit(kind):
    # Drafter columns 0..4 stand for verifier ids 0, 2, 3, 7, 9; the top-4 of each row is fixed.
    column = {0: 0, 2: 1, 3: 2, 7: 3, 9: 4}
    target_logits = logits(2, 12, 10)
    log_p_full = torch.log_softmax(target_logits, -1)
    top_ids = torch.tensor([[2, 5, 9, 1], [11, 0, 3, 7]])
    top_values = log_p_full.gather(1, top_ids)
    index = torch.tensor([[column.get(int(i), -1) for i in row] for row in top_ids])
    draft_logits = logits(2, 5, 11)
    loss = distill_loss(kind, draft_logits, Target(top_values, index))
    p_full, q_all = log_p_full.exp().numpy(), torch.softmax(draft_logits, -1).numpy()
    per_row = []
    for row in range(2):
        known = [int(i) for i in top_ids[row] if int(i) in column]
        rest = 1 - p_full[row, top_ids[row].numpy()].sum()  # mass outside the top-k
        p = np.array([p_full[row, i] for i in known] + [rest])
        q_known = np.array([q_all[row, column[i]] for i in known])
        q = np.append(q_known, 1 - q_known.sum())
        per_row.append(closed_form(kind, (p / p.sum())[None], q[None]))
    assert as_float(loss) == pytest.approx(np.mean(per_row), rel=1e-5)


@pytest.mark.parametrize("kind", LOSSES)
def test_the_conditioned_target_is_a_minimum(kind):
    kept = torch.tensor([1, 4, 5, 8])
    log_p = torch.log_softmax(logits(3, 10, 12), -1)
    assert as_float(distill_loss(kind, log_p[:, kept] + 3.0, Target(log_p[:, kept]))) == pytest.approx(0.0, abs=1e-9)
    assert as_float(distill_loss(kind, logits(3, 4, 13), Target(log_p[:, kept]))) > 1e-3


def test_rows_with_nothing_the_drafter_can_emit_are_left_out():
    draft_logits = logits(2, 3, 14)
    # Row 0: both top-2 ids are outside the drafter's vocabulary and the drafter has no other
    # column left to hold the rest: nothing to learn from it.
    index = torch.tensor([[-1, -1], [0, 1]])
    values = torch.log(torch.tensor([[0.6, 0.4], [0.5, 0.3]], dtype=torch.float64))
    both = distill_loss("fkl", draft_logits, Target(values, index))
    second = distill_loss("fkl", draft_logits[1:], Target(values[1:], index[1:]))
    assert as_float(both) == pytest.approx(as_float(second))


@pytest.mark.parametrize("kind", LOSSES)
def test_losses_and_gradients_stay_finite_at_the_edges(kind):
    # The top-k holds all the mass (nothing left for the rest), and a drafter is very sure.
    values = torch.log(torch.tensor([[0.7, 0.3, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64))
    index = torch.tensor([[0, 1, 2], [3, 2, 1]])
    z = torch.tensor([[30.0, -30.0, 0.0, 1.0, 2.0], [0.0, 0.0, 0.0, 80.0, -80.0]], dtype=torch.float64)
    z.requires_grad_(True)
    loss = distill_loss(kind, z, Target(values, index))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(z.grad).all()


def test_top1_agreement_maps_drafter_columns_to_verifier_ids():
    draft_logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0]])
    kept = torch.tensor([4, 8, 9])
    assert top1_agreement(draft_logits, kept, torch.tensor([8, 9])) == 0.5
    assert top1_agreement(draft_logits, None, torch.tensor([1, 0])) == 1.0


def test_unknown_loss_is_refused():
    with pytest.raises(ValueError):
        distill_loss("mse", logits(1, 3, 0), Target(torch.log_softmax(logits(1, 3, 1), -1)))
