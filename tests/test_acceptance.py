"""The acceptance step yields exactly the target distribution (closed form), and the
vectorised rule behind `rejection_verdict` accepts with exactly that probability."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from polyspec.acceptance import (
    acceptance_probability,
    greedy_verdict,
    rejection_verdict,
    residual_distribution,
)
from polyspec.sampling import LogitsProcessor, SamplingConfig

VOCAB = 12


def output_distribution(target: torch.Tensor, draft: torch.Tensor | None, point_token: int | None = None):
    """Exact distribution of the token emitted at one position, summed over the draft token."""
    out = torch.zeros_like(target, dtype=torch.float64)
    candidates = [(point_token, 1.0)] if draft is None else [(x, float(draft[x])) for x in range(len(draft))]
    for token, weight in candidates:
        if weight == 0:
            continue
        accept = acceptance_probability(target, draft, token)
        out[token] += weight * accept
        out += weight * (1 - accept) * residual_distribution(target, draft, token).double()
    return out


def processed(seed: int, config: SamplingConfig) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, VOCAB, generator=generator) * 2
    context = torch.randint(0, VOCAB, (6,), generator=generator).tolist()
    return LogitsProcessor(config).probs(logits, context, len(context))[0]


CONFIGS = [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.8, top_k=3),
    SamplingConfig(temperature=1.0, top_p=0.6),
    SamplingConfig(temperature=1.0, top_k=5, top_p=0.9, repetition_penalty=1.3, penalty_window=4),
]


@settings(max_examples=200, deadline=None)
@given(
    target_seed=st.integers(0, 10**6),
    draft_seed=st.integers(0, 10**6),
    target_config=st.sampled_from(CONFIGS),
    draft_config=st.sampled_from(CONFIGS),
)
def test_output_is_the_target_for_any_draft_distribution(target_seed, draft_seed, target_config, draft_config):
    target = processed(target_seed, target_config)
    draft = processed(draft_seed, draft_config)
    torch.testing.assert_close(output_distribution(target, draft), target.double(), atol=1e-6, rtol=0)


@settings(max_examples=200, deadline=None)
@given(target_seed=st.integers(0, 10**6), config=st.sampled_from(CONFIGS), token=st.integers(0, VOCAB - 1))
def test_output_is_the_target_for_a_point_mass_draft(target_seed, config, token):
    target = processed(target_seed, config)
    torch.testing.assert_close(output_distribution(target, None, token), target.double(), atol=1e-6, rtol=0)


def test_identical_draft_and_target_always_accepts():
    target = processed(3, CONFIGS[1])
    for token in target.nonzero().flatten().tolist():
        assert acceptance_probability(target, target, token) == 1.0


def test_point_mass_on_an_impossible_token_is_always_rejected():
    target = processed(4, SamplingConfig(temperature=1.0, top_k=2))
    impossible = int((target == 0).nonzero()[0])
    assert acceptance_probability(target, None, impossible) == 0.0
    verdicts = [rejection_verdict([impossible], None, torch.stack([target, target]), None) for _ in range(50)]
    assert all(v.accepted == 0 and target[v.token] > 0 for v in verdicts)


@pytest.mark.parametrize("use_draft_probs", [True, False])
def test_rejection_verdict_accepts_with_the_closed_form_probability(use_draft_probs):
    target = processed(7, SamplingConfig(temperature=1.0))
    draft = processed(8, SamplingConfig(temperature=1.0))
    token = int(draft.argmax())
    draft_probs = draft[None] if use_draft_probs else None
    expected = acceptance_probability(target, draft if use_draft_probs else None, token)
    generator = torch.Generator().manual_seed(0)
    trials = 4000
    accepted = sum(
        rejection_verdict([token], draft_probs, torch.stack([target, target]), generator).accepted
        for _ in range(trials)
    )
    assert stats.binomtest(accepted, trials, expected).pvalue > 1e-3


@pytest.mark.slow
def test_rejection_verdict_emits_the_target_distribution():
    """Chi-square on the emitted token of a one-token draft against p itself."""
    target = processed(11, SamplingConfig(temperature=1.0, top_k=6))
    draft = processed(12, SamplingConfig(temperature=1.0, top_k=6))
    generator = torch.Generator().manual_seed(1)
    counts = np.zeros(VOCAB)
    trials = 6000
    for _ in range(trials):
        token = int(torch.multinomial(draft, 1, generator=generator))
        verdict = rejection_verdict([token], draft[None], torch.stack([target, target]), generator)
        counts[token if verdict.accepted else verdict.token] += 1
    support = target > 0
    assert counts[~support.numpy()].sum() == 0
    expected = target[support].double().numpy()
    result = stats.chisquare(counts[support.numpy()], trials * expected / expected.sum())
    assert result.pvalue > 1e-3


def test_greedy_verdict_counts_the_matching_prefix():
    assert greedy_verdict([5, 6, 7], [5, 6, 9, 1]).accepted == 2
    assert greedy_verdict([5, 6, 7], [5, 6, 9, 1]).token == 9
    assert greedy_verdict([5, 6], [5, 6, 4]).token == 4  # bonus
    assert greedy_verdict([], [8]).accepted == 0 and greedy_verdict([], [8]).token == 8
