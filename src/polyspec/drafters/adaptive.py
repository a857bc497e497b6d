"""Adaptive drafting: each step, which drafter drafts and how far, so that speculation pays.

A draft of n tokens is worth E(n) = 1 + a1 + a1 a2 + ... + a1...an tokens for one verify call
of width n + 1, where ai is the chance that draft position i is kept once the ones before it
were. The drafter that maximises E(n) / (draft time + verify time(n + 1)) drafts, and n = 0 —
plain decoding — wins whenever no draft is expected to pay, so adaptive decoding is never slower
than plain decoding by more than the bookkeeping.

- Verify time by width is measured once on the model and device (`measure_verify_costs`), then
  follows the step times this decoder observes (`StepCosts`).
- ai are running estimates per drafter and depth (a Beta prior, with old evidence decaying).
- Deterministic drafters (point masses: n-gram argmax, prompt lookup) propose every step, chosen
  or not: whatever the verifier emits is distributed as plain decoding, so comparing a shadow
  proposal with the tokens that followed is an unbiased look at its acceptance at no verify cost.
- Exactness when the verifier samples: a stochastic draft (tokens drawn from rows q) may only be
  cut by a rule that looks at what came before each token, never at the token itself. Such
  drafters are chosen from past evidence before they draft, and cut sequentially: token i is
  kept when adding it raises the expected rate, which depends on depth and on the peak of row
  i (a function of the tokens before it).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from polyspec.drafters.base import Drafter
from polyspec.types import EMPTY_DRAFT, Draft


@dataclass(frozen=True)
class VerifyCosts:
    """Seconds of one verifier forward by width (tokens fed after a cached context)."""

    widths: tuple[int, ...]
    seconds: tuple[float, ...]

    def __call__(self, width: int) -> float:
        widths, seconds = self.widths, self.seconds
        if width <= widths[0]:
            return seconds[0]
        for i in range(1, len(widths)):
            if width <= widths[i]:
                w0, w1, s0, s1 = widths[i - 1], widths[i], seconds[i - 1], seconds[i]
                return s0 + (s1 - s0) * (width - w0) / (w1 - w0)
        slope = (seconds[-1] - seconds[-2]) / (widths[-1] - widths[-2]) if len(widths) > 1 else 0.0
        return seconds[-1] + slope * (width - widths[-1])

    def to_dict(self) -> dict:
        return {"widths": list(self.widths), "seconds": list(self.seconds)}

    @classmethod
    def from_dict(cls, data: dict) -> VerifyCosts:
        return cls(tuple(int(w) for w in data["widths"]), tuple(float(s) for s in data["seconds"]))


def measure_verify_costs(
    model: torch.nn.Module, widths: Sequence[int] = (1, 2, 4, 8, 16, 32), context: int = 200, repeats: int = 3
) -> VerifyCosts:
    """Median time of a forward of each width after `context` cached tokens (random ids)."""
    from polyspec.cached_lm import CachedLM
    from polyspec.models import synchronizer

    lm = CachedLM(model)
    sync = synchronizer(lm.device)
    vocab = model.get_output_embeddings().weight.shape[0]
    rng = random.Random(0)
    lm.reset()
    lm.forward([rng.randrange(vocab) for _ in range(context)], num_logits=1)
    seconds = []
    for width in widths:
        times = []
        for _ in range(repeats + 1):  # the first forward of a width warms up
            tokens = [rng.randrange(vocab) for _ in range(width)]
            sync()
            began = time.perf_counter()
            lm.forward(tokens)
            sync()
            times.append(time.perf_counter() - began)
            lm.rollback(context)
        seconds.append(sorted(times[1:])[len(times[1:]) // 2])
    return VerifyCosts(tuple(widths), tuple(seconds))


class DepthAcceptance:
    """P(draft position d is kept | positions before it were), per depth, from decaying counts
    with a Beta(1, 1) prior; a confidence bucket (row peak) refines it where rows exist."""

    BUCKETS = 4

    def __init__(self, max_depth: int, decay: float = 0.995) -> None:
        self.decay = decay
        size = (max_depth + 1, self.BUCKETS + 1)  # the last bucket: no confidence known
        self.hits = [[0.0] * size[1] for _ in range(size[0])]
        self.trials = [[0.0] * size[1] for _ in range(size[0])]

    def bucket(self, confidence: float | None) -> int:
        return self.BUCKETS if confidence is None else min(int(confidence * self.BUCKETS), self.BUCKETS - 1)

    def rate(self, depth: int, confidence: float | None = None) -> float:
        depth = min(depth, len(self.hits) - 1)
        b = self.bucket(confidence)
        return (self.hits[depth][b] + 1.0) / (self.trials[depth][b] + 2.0)

    def update(self, depth: int, confidence: float | None, kept: bool) -> None:
        """Counts in the confidence's bucket and in the no-confidence one, which then holds the
        rate by depth alone (what a choice made before drafting can use)."""
        depth = min(depth, len(self.hits) - 1)
        for b in {self.bucket(confidence), self.BUCKETS}:
            self.hits[depth][b] = self.hits[depth][b] * self.decay + kept
            self.trials[depth][b] = self.trials[depth][b] * self.decay + 1.0


# A drafter not tried for this many steps gets one short draft: it may pay again by now.
EXPLORE_EVERY = 16
# How much better than plain decoding a draft's expected rate must be to be sent.
PLAIN_MARGIN = 1.02
# Drafters cheaper than this share of a verify call propose every step (shadows).
SHADOW_COST_SHARE = 0.1


class _Arm:
    """One drafter with what is known of it."""

    def __init__(self, name: str, drafter: Drafter, max_depth: int) -> None:
        self.name = name
        self.drafter = drafter
        self.acceptance = DepthAcceptance(max_depth)
        self.seconds_per_token = 0.0  # decaying mean of a proposal's time per token asked for
        self.calls = 0
        self.last_chosen = 0
        self.pending: tuple[int, list[int], list[float | None]] | None = None  # start, tokens, confidences
        self.stochastic = False  # seen to hand over rows while the verifier samples

    def shadowed(self, verify_seconds: float, greedy: bool) -> bool:
        """Deterministic and cheap: it may propose every step, chosen or not."""
        cheap = self.seconds_per_token * 4 < SHADOW_COST_SHARE * verify_seconds
        return cheap and not (self.stochastic and not greedy)

    def timed_propose(self, context: Sequence[int], k: int) -> Draft:
        began = time.perf_counter()
        draft = self.drafter.propose(context, k)
        spent = time.perf_counter() - began
        self.calls += 1
        self.seconds_per_token += (spent / max(k, 1) - self.seconds_per_token) / min(self.calls, 20)
        return draft

    def resolve(self, context: Sequence[int]) -> None:
        """Score the pending proposal against the tokens that followed it."""
        if self.pending is None:
            return
        start, tokens, marks = self.pending
        self.pending = None
        known = len(context) - start
        for depth, (token, confidence) in enumerate(zip(tokens, marks, strict=True), start=1):
            if depth > known:
                return
            kept = context[start + depth - 1] == token
            self.acceptance.update(depth, confidence, kept)
            if not kept:
                return


def confidences(draft: Draft) -> list[float | None]:
    """Row peaks of a stochastic draft (each a function of the tokens before it), else None."""
    if draft.probs is None:
        return [None] * len(draft)
    return [float(p) for p in draft.probs.max(dim=-1).values.tolist()]


class StepCosts:
    """Seconds of a whole verify step by width, as this decoder sees them: the measured forward
    curve, scaled to and then replaced by the observed time between two proposals (which adds
    the judging of every row, and whatever else the machine is doing)."""

    def __init__(self, forward: VerifyCosts, decay: float = 0.9) -> None:
        self.forward = forward
        self.decay = decay
        self.observed: dict[int, tuple[float, float]] = {}  # width -> (decayed sum, decayed count)

    def record(self, width: int, seconds: float) -> None:
        total, count = self.observed.get(width, (0.0, 0.0))
        self.observed[width] = (total * self.decay + seconds, count * self.decay + 1.0)

    def __call__(self, width: int) -> float:
        total, count = self.observed.get(width, (0.0, 0.0))
        if count >= 3:
            return total / count
        scales = [t / c / self.forward(w) for w, (t, c) in self.observed.items() if c >= 1]
        return self.forward(width) * (sum(scales) / len(scales) if scales else 1.0)


class AdaptiveDrafter:
    """Routes among drafters and sizes each draft by the expected tokens per second."""

    def __init__(
        self, drafters: dict[str, Drafter], costs: VerifyCosts, max_depth: int = 8, observe_costs: bool = True
    ) -> None:
        self.observe_costs = observe_costs  # off: trust the measured curve alone (reproducible choices)
        self.arms = [_Arm(name, drafter, max_depth) for name, drafter in drafters.items()]
        self.costs = StepCosts(costs)
        self.max_depth = max_depth
        self.route: Counter[str] = Counter()  # proposals by the drafter that made them ("" = plain steps)
        self._greedy = True
        self._steps = 0
        self._sent: tuple[int, float] | None = None  # width of the last step and when it began

    def start(self, prompt_ids, processor, generator) -> None:
        # Estimates carry over from earlier sequences: they describe the drafters on this verifier.
        self._greedy = processor.config.greedy
        for arm in self.arms:
            arm.drafter.start(prompt_ids, processor, generator)
            arm.pending = None
        self._sent = None

    def _cut(self, arm: _Arm, marks: Sequence[float | None]) -> tuple[int, float]:
        """(n, expected tokens per second): extend while the rate rises (a sequential rule)."""
        best_n, best = 0, 1.0 / self.costs(1)
        expected, survive = 1.0, 1.0
        for n, confidence in enumerate(marks, start=1):
            survive *= arm.acceptance.rate(n, confidence)
            expected += survive
            rate = expected / (n * arm.seconds_per_token + self.costs(n + 1))
            if rate <= best:
                break
            best_n, best = n, rate
        return best_n, best

    def propose(self, context: Sequence[int], k: int) -> Draft:
        if self._sent is not None and self.observe_costs:
            width, began = self._sent
            self.costs.record(width, time.perf_counter() - began)
        draft = self._choose(context, k)
        self._sent = (len(draft) + 1, time.perf_counter())
        return draft

    def _choose(self, context: Sequence[int], k: int) -> Draft:
        for arm in self.arms:
            arm.resolve(context)
        self._steps += 1
        k = min(k, self.max_depth)
        if k <= 0:
            return EMPTY_DRAFT
        verify = self.costs(1)
        # A draft must beat plain decoding by a margin: a wider step also costs judging its rows.
        best_rate, best_arm, best_draft, best_n = PLAIN_MARGIN / verify, None, None, 0
        for arm in self.arms:
            draft = None
            if arm.shadowed(verify, self._greedy):
                draft = arm.timed_propose(context, k)
                if draft.probs is not None and not self._greedy:
                    arm.stochastic = True  # its rows depend on its draws: never cut by looking at them
                    continue
                arm.pending = (len(context), list(draft.tokens), [None] * len(draft))
                n, rate = self._cut(arm, [None] * len(draft))
            else:
                n, rate = self._cut(arm, [None] * k)
                if self._steps - arm.last_chosen >= EXPLORE_EVERY:
                    n, rate = 1, float("inf")
            if n and rate > best_rate:
                best_rate, best_arm, best_draft, best_n = rate, arm, draft, n
        if best_arm is None:
            self.route[""] += 1
            return EMPTY_DRAFT
        arm, n = best_arm, best_n
        arm.last_chosen = self._steps
        self.route[arm.name] += 1
        if best_draft is not None:
            return Draft(tokens=best_draft.tokens[:n])
        # Chosen from evidence alone: draw n tokens, then cut by the rows' peaks, token by token.
        draft = arm.timed_propose(context, n)
        marks = confidences(draft)
        n, _ = self._cut(arm, marks) if draft.probs is not None else (len(draft), 0.0)
        arm.pending = (len(context), list(draft.tokens[:n]), marks[:n])
        if n == 0:
            return EMPTY_DRAFT
        return Draft(tokens=draft.tokens[:n], probs=None if draft.probs is None else draft.probs[:n])
