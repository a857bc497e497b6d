"""Logit processing shared by plain and speculative decoding.

Both decoding paths turn the verifier's logits into a next-token choice through the same
`LogitsProcessor`, position by position, with exactly the tokens before that position as
context. That is what makes speculative output distributed exactly as plain output.

Order (as in transformers): repetition penalty, temperature, top-k, top-p.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from polyspec.errors import UserError


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy; top_k 0 and top_p 1 switch those filters off;
    penalty_window 0 applies the repetition penalty to the whole context."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    penalty_window: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise UserError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise UserError(f"top-k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise UserError(f"repetition penalty must be > 0, got {self.repetition_penalty}")
        if self.penalty_window < 0:
            raise UserError(f"penalty window must be >= 0, got {self.penalty_window}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


STUDY_SAMPLING = SamplingConfig(temperature=1.0, top_k=50, top_p=0.9, repetition_penalty=1.1, penalty_window=16)


class LogitsProcessor:
    """Applies a `SamplingConfig` to rows of logits.

    Row j of `logits` predicts the token at position `start + j` of `ids + draft`, so its
    context is `(ids + draft)[:start + j]` (the repetition penalty looks at that context only).
    The draft is passed apart so that no step copies the whole sequence. The `*_after` forms
    take one context per row instead (`ids + suffixes[j]`): the nodes of a token tree, each
    after its own path.
    """

    def __init__(self, config: SamplingConfig) -> None:
        self.config = config

    def penalize(self, logits: torch.Tensor, ids: Sequence[int], start: int, draft: Sequence[int] = ()) -> torch.Tensor:
        """logits: [n, V]. Returns float32 logits with the repetition penalty applied (never
        modifies its input)."""
        return self._penalize_rows(logits, self._seen(logits.shape[0], ids, start, draft))

    def penalize_after(
        self, logits: torch.Tensor, ids: Sequence[int], suffixes: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        """Like `penalize`, but row j's context is `ids + suffixes[j]`: the rows of a token tree,
        each after its own root-to-node path."""
        return self._penalize_rows(logits, self._seen_after(ids, suffixes))

    def _seen(self, rows: int, ids: Sequence[int], start: int, draft: Sequence[int]) -> list[list[int]] | None:
        """The tokens the penalty looks at for each row (None: no penalty)."""
        if self.config.repetition_penalty == 1.0:
            return None
        window = self.config.penalty_window
        seen_rows = []
        for j in range(rows):
            end = start + j
            first = max(0, end - window) if window else 0
            seen_rows.append([*ids[first:end], *draft[max(0, first - len(ids)) : max(0, end - len(ids))]])
        return seen_rows

    def _seen_after(self, ids: Sequence[int], suffixes: Sequence[Sequence[int]]) -> list[list[int]] | None:
        if self.config.repetition_penalty == 1.0:
            return None
        window = self.config.penalty_window
        seen_rows = []
        for suffix in suffixes:
            if not window:
                seen_rows.append([*ids, *suffix])
                continue
            from_ids = window - len(suffix)
            seen_rows.append([*(ids[-from_ids:] if from_ids > 0 else ()), *suffix[-window:]])
        return seen_rows

    def _penalize_rows(self, logits: torch.Tensor, seen_rows: Sequence[Sequence[int]] | None) -> torch.Tensor:
        """Row j's logits of the tokens in seen_rows[j] divided (if positive) or multiplied by
        the penalty, once per distinct token."""
        if seen_rows is None:
            return logits.float()
        penalty = self.config.repetition_penalty
        logits = logits.float().clone()
        for j, seen in enumerate(seen_rows):
            if not seen:
                continue
            index = torch.tensor(seen, dtype=torch.long, device=logits.device)
            picked = logits[j, index]
            logits[j, index] = torch.where(picked > 0, picked / penalty, picked * penalty)
        return logits

    def _penalize_candidates(
        self, scores: torch.Tensor, index: torch.Tensor, seen_rows: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        """`_penalize_rows` on some tokens of each row: scores[j, i] is token index[j, i]'s."""
        width = max(1, max(len(seen) for seen in seen_rows))
        seen = torch.full((len(seen_rows), width), -1, dtype=torch.long)
        for j, tokens in enumerate(seen_rows):
            seen[j, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        hit = (index.unsqueeze(-1) == seen.to(index.device).unsqueeze(1)).any(dim=-1)
        penalty = self.config.repetition_penalty
        return torch.where(hit, torch.where(scores > 0, scores / penalty, scores * penalty), scores)

    def greedy_tokens(
        self, logits: torch.Tensor, ids: Sequence[int], start: int, draft: Sequence[int] = ()
    ) -> list[int]:
        """The argmax token of each row after the repetition penalty."""
        if self.config.repetition_penalty == 1.0:
            return logits.argmax(dim=-1).tolist()  # widening to float32 cannot change the argmax
        return self.penalize(logits, ids, start, draft).argmax(dim=-1).tolist()

    def greedy_after(self, logits: torch.Tensor, ids: Sequence[int], suffixes: Sequence[Sequence[int]]) -> list[int]:
        """`greedy_tokens` with row j after `ids + suffixes[j]`."""
        if self.config.repetition_penalty == 1.0:
            return logits.argmax(dim=-1).tolist()
        return self.penalize_after(logits, ids, suffixes).argmax(dim=-1).tolist()

    def probs(self, logits: torch.Tensor, ids: Sequence[int], start: int, draft: Sequence[int] = ()) -> torch.Tensor:
        """[n, V] sampling distribution of each row, zero outside the top-k / top-p sets."""
        return self._distribution(logits, self._seen(logits.shape[0], ids, start, draft))

    def probs_after(self, logits: torch.Tensor, ids: Sequence[int], suffixes: Sequence[Sequence[int]]) -> torch.Tensor:
        """`probs` with row j after `ids + suffixes[j]`."""
        return self._distribution(logits, self._seen_after(ids, suffixes))

    def _distribution(self, logits: torch.Tensor, seen_rows: Sequence[Sequence[int]] | None) -> torch.Tensor:
        cfg = self.config
        vocab = logits.shape[-1]
        if cfg.top_k and cfg.top_k < vocab:
            # The penalty only lowers logits, so the k best after it lie among the k + |seen| best
            # before it: copying, penalising or sorting 262k logits per row would dominate the step.
            extra = max((len(set(seen)) for seen in seen_rows), default=0) if seen_rows else 0
            scores, index = torch.topk(logits, min(vocab, cfg.top_k + extra), dim=-1)
            scores = scores.float()
            if seen_rows:
                scores = self._penalize_candidates(scores, index, seen_rows)
            kept_scores, kept = torch.topk(scores / cfg.temperature, cfg.top_k, dim=-1)
            kept_probs = _nucleus(kept_scores, cfg.top_p)
            empty = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
            return empty.scatter_(-1, index.gather(-1, kept), kept_probs)
        scores = self._penalize_rows(logits, seen_rows) / cfg.temperature
        if cfg.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
            return torch.zeros_like(scores).scatter_(-1, order, _nucleus(sorted_scores, cfg.top_p))
        return torch.softmax(scores, dim=-1)


def _nucleus(sorted_scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """sorted_scores: [n, m] in descending order. Keeps the smallest prefix whose mass reaches
    top_p (at least one token) and returns its renormalised probabilities, [n, m]."""
    probs = torch.softmax(sorted_scores, dim=-1)
    if top_p < 1.0:
        mass_before = probs.cumsum(dim=-1) - probs
        probs = probs.masked_fill(mass_before >= top_p, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from a [V] distribution. The draw is among the tokens it can give
    (top-k leaves 50 of 262k): a multinomial over the whole vocabulary costs ~25x more."""
    support = probs.nonzero().flatten()
    return int(support[torch.multinomial(probs[support], 1, generator=generator)].item())
