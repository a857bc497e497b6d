"""A smaller causal LM with the verifier's tokenizer as drafter.

It keeps its own cache, cut back to the longest prefix it shares with the accepted context,
and drafts k tokens one forward at a time. When the verifier samples, the drafter samples from
its own logits processed exactly as the verifier's are (same temperature, top-k, top-p and
repetition penalty) and hands over that distribution, so rejection sampling stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from polyspec.cached_lm import CachedLM
from polyspec.models import LoadedModel
from polyspec.sampling import LogitsProcessor, sample
from polyspec.types import EMPTY_DRAFT, Draft


class ModelDrafter:
    def __init__(self, draft: LoadedModel, vocab_size: int) -> None:
        self.lm = CachedLM(draft.model)
        self.vocab_size = vocab_size  # the verifier's: draft rows are cut or padded to it
        self._fed: list[int] = []
        self.processor: LogitsProcessor | None = None
        self.generator: torch.Generator | None = None

    def start(self, prompt_ids, processor, generator) -> None:
        self.lm.reset()
        self._fed = []
        self.processor, self.generator = processor, generator

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Rows padded to another size: extra ids are padding, missing ids get no mass."""
        size = logits.shape[-1]
        if size > self.vocab_size:
            return logits[..., : self.vocab_size]
        if size < self.vocab_size:
            pad = logits.new_full((*logits.shape[:-1], self.vocab_size - size), float("-inf"))
            return torch.cat([logits, pad], dim=-1)
        return logits

    def propose(self, context: Sequence[int], k: int) -> Draft:
        if k <= 0:
            return EMPTY_DRAFT
        context = list(context)
        shared = 0
        limit = min(len(self._fed), len(context) - 1)
        while shared < limit and self._fed[shared] == context[shared]:
            shared += 1
        self.lm.rollback(shared)
        pending = context[shared:]
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        sequence = context
        greedy = self.processor.config.greedy
        for _ in range(k):
            logits = self._fit_vocab(self.lm.forward(pending, num_logits=1))
            position = len(sequence)
            if greedy:
                token = self.processor.greedy_tokens(logits, sequence, position)[0]
            else:
                probs = self.processor.probs(logits, sequence, position)[0]
                token = sample(probs, self.generator)
                rows.append(probs)
            tokens.append(token)
            sequence = sequence + [token]
            pending = [token]
        self._fed = sequence[:-1]
        return Draft(tokens=tokens, probs=torch.stack(rows) if rows else None)

    @classmethod
    def for_verifier(cls, draft: LoadedModel, verifier: LoadedModel) -> ModelDrafter:
        """A drafter whose ids mean what the verifier's mean, or a clear error."""
        from polyspec.vocabulary import fingerprint, require_same

        require_same(fingerprint(draft.tokenizer), verifier.tokenizer, f"drafter {draft.name!r}", verifier.name)
        return cls(draft, verifier.vocab_size)
