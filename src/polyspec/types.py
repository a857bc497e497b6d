"""Small value types shared by the engine, the drafters and the command line."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Draft:
    """Tokens a drafter proposes for the positions after the context.

    tokens: [k] proposed token ids (k may be 0: the verifier then emits one token on its own).
    probs:  [k, V] the distribution each token was drawn from, or None for a point mass
            (a deterministic drafter: n-gram argmax, prompt lookup, greedy draft model).
    """

    tokens: list[int]
    probs: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.tokens)


EMPTY_DRAFT = Draft(tokens=[])


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one draft.

    accepted: how many leading draft tokens were kept.
    token:    the verifier's own token after them: a *recovered* token when a draft token was
              rejected, a *bonus* token when all of them were accepted.
    path:     for a token tree, the kept nodes from the root down (None for a chain, whose kept
              nodes are its first `accepted`).
    """

    accepted: int
    token: int
    path: tuple[int, ...] | None = None

    @property
    def kept(self) -> Sequence[int]:
        """Indices of the kept draft nodes, in order."""
        return range(self.accepted) if self.path is None else self.path


@dataclass
class GenerationStats:
    """Counters for one generation; the derived rates are properties so they never disagree.

    drafted counts draft tokens as Leviathan et al. and the study do: after a rejection,
    only up to and including the first rejected token (later ones were never judged). For a
    token tree, a level counts once however many siblings were tried there; proposed counts
    every node. nodes_verified counts every position the verifier was fed in its verify calls
    (the pending token and the draft nodes), so nodes_verified / verifier_calls is the mean
    verify width.
    """

    drafted: int = 0
    accepted: int = 0
    proposed: int = 0  # every drafted token, judged or not
    verifier_calls: int = 0
    nodes_verified: int = 0
    new_tokens: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    seconds: float = 0.0
    # reached[i] / accepted_at[i]: how often draft position i was judged / accepted.
    reached: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_call(self) -> float:
        return self.new_tokens / self.verifier_calls if self.verifier_calls else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / r if r else 0.0 for a, r in zip(self.accepted_at, self.reached, strict=True)]

    def record(self, proposed: int, accepted: int, judged: int | None = None) -> None:
        """Count one verified draft of `proposed` tokens (or tree nodes) of which `accepted` were
        kept; `judged` levels were decided (default, a chain's: up to the first rejection)."""
        if judged is None:
            judged = min(proposed, accepted + 1)
        self.proposed += proposed
        self.drafted += judged
        self.accepted += accepted
        while len(self.reached) < judged:
            self.reached.append(0)
            self.accepted_at.append(0)
        for i in range(judged):
            self.reached[i] += 1
            self.accepted_at[i] += i < accepted

    def to_dict(self) -> dict:
        return {
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "verifier_calls": self.verifier_calls,
            "nodes_verified": self.nodes_verified,
            "tokens_per_call": self.tokens_per_call,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second,
            "new_tokens": self.new_tokens,
            "proposed": self.proposed,
            "acceptance_by_position": self.acceptance_by_position,
        }


@dataclass(frozen=True)
class Generation:
    """What one call of `generate` returns."""

    token_ids: list[int]  # generated ids only
    text: str
    stats: GenerationStats
    stop_reason: str  # "eos" | "stop_string" | "length"
