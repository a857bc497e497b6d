"""A bandit over drafting policies, rewarded by the tokens per second their steps delivered.

The router's per-step estimates (acceptance by depth, step costs by width) can be biased where
evidence is sparse: a sampled chain is judged past depth 1 only when its first token was kept,
so deep estimates rest on few trials and the router cuts its drafts shorter than they pay. A
policy's measured rate has no such bias: whatever a step cost (drafting, verifying, judging) and
whatever it delivered is counted as it happened.

Thompson sampling: each policy's rate is known as (mean tokens per step) / (mean seconds per
step), uncertain by the standard error of the tokens' mean; every step draws one plausible rate
per policy and follows the highest. A policy clearly behind is then seldom tried, one within
the noise keeps being tried. Sums decay, so a policy that stops paying loses its place, and
every policy is tried `MIN_TRIES` times first. Draws come from the bandit's own seeded
generator, never the decoder's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

MIN_TRIES = 4


class PolicyBandit:
    def __init__(self, names: Sequence[str], decay: float = 0.995, seed: int = 0) -> None:
        self.names = list(names)
        self.decay = decay
        self.rng = random.Random(seed)
        # Per policy, decayed: steps, tokens, tokens squared, seconds.
        self.sums = {name: [0.0, 0.0, 0.0, 0.0] for name in self.names}
        self.tries = dict.fromkeys(self.names, 0)

    def rate(self, name: str) -> float:
        """Decayed tokens per decayed second (0 before any step)."""
        _, tokens, _, seconds = self.sums[name]
        return tokens / seconds if seconds > 0 else 0.0

    def _draw(self, name: str) -> float:
        steps, tokens, squares, seconds = self.sums[name]
        mean = tokens / steps
        spread = math.sqrt(max(squares / steps - mean * mean, 0.0) / steps)
        return (mean + spread * self.rng.gauss(0.0, 1.0)) / (seconds / steps)

    def choose(self) -> str:
        untried = [name for name in self.names if self.tries[name] < MIN_TRIES]
        if untried:
            return min(untried, key=lambda n: (self.tries[n], self.names.index(n)))
        return max(self.names, key=self._draw)

    def record(self, name: str, tokens: int, seconds: float) -> None:
        sums = self.sums[name]
        for i, value in enumerate((1.0, tokens, tokens * tokens, seconds)):
            sums[i] = sums[i] * self.decay + value
        self.tries[name] += 1
