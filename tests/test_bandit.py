"""The policy bandit tries every policy, then follows the measured rates, and forgets old ones."""

from __future__ import annotations

import random

from polyspec.drafters.bandit import MIN_TRIES, PolicyBandit


def run(bandit: PolicyBandit, steps: int, rates: dict[str, float], seed: int = 0) -> dict[str, int]:
    """Steps of 0.1 s that deliver each policy's tokens per second on average (noisy)."""
    rng = random.Random(seed)
    chosen = dict.fromkeys(bandit.names, 0)
    for _ in range(steps):
        name = bandit.choose()
        chosen[name] += 1
        bandit.record(name, rng.choice([0, 2]) * rates[name] * 0.1, 0.1)
    return chosen


def test_every_policy_is_tried_before_any_is_preferred():
    bandit = PolicyBandit(["a", "b", "c"])
    first = []
    for _ in range(3 * MIN_TRIES):
        name = bandit.choose()
        first.append(name)
        bandit.record(name, 5 if name == "a" else 1, 1.0)  # "a" pays from its first step on
    assert sorted(first) == sorted(["a", "b", "c"] * MIN_TRIES)


def test_the_policy_with_the_best_measured_rate_gets_most_steps():
    bandit = PolicyBandit(["slow", "fast", "middling"])
    chosen = run(bandit, 400, {"slow": 10.0, "fast": 20.0, "middling": 14.0})
    assert chosen["fast"] > 340


def test_a_policy_that_stops_paying_loses_its_place():
    bandit = PolicyBandit(["a", "b"])
    run(bandit, 200, {"a": 20.0, "b": 10.0})
    run(bandit, 500, {"a": 5.0, "b": 10.0}, seed=1)  # its old evidence decays
    chosen = run(bandit, 300, {"a": 5.0, "b": 10.0}, seed=2)
    assert chosen["b"] > 240
