"""A bandit over drafting policies, rewarded by the tokens per second their steps delivered.

The router's per-step estimates (acceptance by depth, step costs by width) can be biased where
evidence is sparse: a sampled chain is judged past depth 1 only when its first token was kept,
so deep estimates rest on few trials and the router cuts its drafts shorter than they pay. A
policy's measured rate has no such bias: whatever a step cost (drafting, verifying, judging) and
whatever it delivered is counted as it happened. Rates are decayed sums, so a policy that stops
paying loses its place; every policy is tried `MIN_TRIES` times first, and the one tried least
recently gets one more step every `EXPLORE_EVERY` steps.
"""

from __future__ import annotations

from collections.abc import Sequence

MIN_TRIES = 4
EXPLORE_EVERY = 16


class PolicyBandit:
    def __init__(self, names: Sequence[str], decay: float = 0.995) -> None:
        self.names = list(names)
        self.decay = decay
        self.tokens = dict.fromkeys(self.names, 0.0)
        self.seconds = dict.fromkeys(self.names, 0.0)
        self.tries = dict.fromkeys(self.names, 0)
        self.last_tried = dict.fromkeys(self.names, 0)
        self.steps = 0

    def rate(self, name: str) -> float:
        """Decayed tokens per decayed second (0 before any step)."""
        return self.tokens[name] / self.seconds[name] if self.seconds[name] > 0 else 0.0

    def choose(self) -> str:
        self.steps += 1
        untried = [name for name in self.names if self.tries[name] < MIN_TRIES]
        if untried:
            name = min(untried, key=lambda n: (self.tries[n], self.names.index(n)))
        elif self.steps % EXPLORE_EVERY == 0:
            name = min(self.names, key=lambda n: self.last_tried[n])
        else:
            name = max(self.names, key=self.rate)
        self.last_tried[name] = self.steps
        return name

    def record(self, name: str, tokens: int, seconds: float) -> None:
        self.tokens[name] = self.tokens[name] * self.decay + tokens
        self.seconds[name] = self.seconds[name] * self.decay + seconds
        self.tries[name] += 1
