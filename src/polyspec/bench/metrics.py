"""The benchmark's metrics, defined once.

alpha  acceptance rate (Leviathan et al.; the study): accepted / drafted, where after a
       rejection a draft counts only up to and including its first rejected token.
tau    tokens per verifier call: new tokens / verifier calls.
c      cost ratio: draft seconds per drafted token / verify seconds per verifier call.
E      expected tokens per call for draft length g: (1 - alpha^(g+1)) / (1 - alpha).
f      speedup. Measured: plain seconds / speculative seconds for the same prompt and length.
       Predicted: E * t_step / (g * t_draft + t_verify), with t_step the plain run's seconds per
       verifier call, t_draft the seconds per drafted token and t_verify the seconds per
       speculative verifier call, all measured (on a CPU a verify call over g + 1 tokens does
       not cost exactly one step, so the measured t_verify replaces the flat-cost assumption
       behind the textbook f = E / (g c + 1)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, gamma: int, t_step: float, t_draft: float, t_verify: float) -> float:
    return expected_tokens_per_call(alpha, gamma) * t_step / (gamma * t_draft + t_verify)


def cost_ratio(draft_seconds: float, proposed: int, verify_seconds: float, verifier_calls: int) -> float:
    if not proposed or not verifier_calls:
        return 0.0
    return (draft_seconds / proposed) / (verify_seconds / verifier_calls)


def chrf(hypothesis: str, reference: str | None) -> float | None:
    if reference is None:
        return None
    from sacrebleu.metrics import CHRF

    return CHRF().sentence_score(hypothesis, [reference]).score


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first token where two outputs differ (None when identical)."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t confidence interval (0 for fewer than 2 values)."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    from scipy import stats

    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return mean, stats.t.ppf(0.975, len(values) - 1) * sd / math.sqrt(len(values))
