"""Plain and speculative decoding: one loop, where plain decoding is the empty draft.

Each step feeds the pending token plus the draft to the verifier in one forward, turns the
k + 1 rows of logits into choices with the shared `LogitsProcessor`, keeps the accepted draft
tokens and the verifier's own next token, and cuts the cache back to what was kept. With
`NoDrafter` every step is an ordinary single-token decoding step through the same code, so
timings compare like with like.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from polyspec.acceptance import greedy_verdict, rejection_verdict
from polyspec.drafters.base import Drafter, NoDrafter
from polyspec.errors import UserError
from polyspec.models import CachedLM, LoadedModel
from polyspec.sampling import LogitsProcessor, SamplingConfig
from polyspec.types import EMPTY_DRAFT, Generation, GenerationStats, Verdict


@dataclass(frozen=True)
class StopConditions:
    max_new_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()


def check_budget(gamma: int, max_new_tokens: int) -> None:
    """Draft length and token budget must be positive (checked before any model loads)."""
    if gamma < 1:
        raise UserError(f"gamma must be >= 1, got {gamma}")
    if max_new_tokens < 1:
        raise UserError(f"max new tokens must be >= 1, got {max_new_tokens}")


class Decoder:
    """Generates from one verifier with any drafter; reusable across prompts."""

    def __init__(self, verifier: LoadedModel) -> None:
        self.verifier = verifier
        self.lm = CachedLM(verifier.model)
        self._synchronize = torch.cuda.synchronize if verifier.device.type == "cuda" else (lambda: None)

    def eos_token_ids(self) -> frozenset[int]:
        ids = self.verifier.model.generation_config.eos_token_id
        if ids is None:
            ids = self.verifier.tokenizer.eos_token_id
        if ids is None:
            return frozenset()
        return frozenset(ids if isinstance(ids, list) else [ids])

    def encode(self, text: str) -> list[int]:
        if not text:
            raise UserError("the prompt is empty")
        ids = self.verifier.tokenizer(text)["input_ids"]
        if not ids:
            raise UserError("the prompt encodes to no tokens")
        return ids

    def generate(
        self,
        prompt_ids: Sequence[int],
        drafter: Drafter | None = None,
        gamma: int = 3,
        sampling: SamplingConfig = SamplingConfig(),
        max_new_tokens: int = 64,
        stop_strings: Sequence[str] = (),
        seed: int = 0,
        eos_token_ids: frozenset[int] | None = None,
    ) -> Generation:
        drafter = drafter or NoDrafter()
        check_budget(gamma, max_new_tokens)
        if not prompt_ids:
            raise UserError("the prompt is empty")
        limit = self.verifier.max_length
        if limit is not None and len(prompt_ids) + max_new_tokens > limit:
            raise UserError(
                f"prompt ({len(prompt_ids)} tokens) + max new tokens ({max_new_tokens}) exceeds the "
                f"model's context of {limit} tokens"
            )
        stop = StopConditions(
            max_new_tokens=max_new_tokens,
            eos_token_ids=self.eos_token_ids() if eos_token_ids is None else eos_token_ids,
            stop_strings=tuple(stop_strings),
        )
        generator = torch.Generator(device=self.verifier.device).manual_seed(seed)
        processor = LogitsProcessor(sampling)
        return self._run(list(prompt_ids), drafter, gamma, processor, generator, stop)

    def _run(self, ids, drafter, gamma, processor, generator, stop) -> Generation:
        stats = GenerationStats()
        prompt_length = len(ids)
        sync = self._synchronize
        clock = time.perf_counter
        sync()
        began = clock()
        self.lm.reset()
        if len(ids) > 1:
            self.lm.forward(ids[:-1], num_logits=1)  # the cache holds all but the pending token
        drafter.start(ids, processor, generator)
        stop_reason = "length"
        while True:
            new_count = len(ids) - prompt_length
            # Never draft past the budget: k accepted tokens plus the verifier's own make k + 1.
            k = min(gamma, stop.max_new_tokens - new_count - 1)
            t0 = clock()
            draft = drafter.propose(ids, k) if k > 0 else EMPTY_DRAFT
            sync()
            t1 = clock()
            logits = self.lm.forward([ids[-1], *draft.tokens])
            verdict = self._judge(draft, logits, ids, processor, generator)
            sync()
            t2 = clock()
            stats.draft_seconds += t1 - t0
            stats.verify_seconds += t2 - t1
            stats.verifier_calls += 1
            stats.record(len(draft), verdict.accepted)
            self.lm.rollback(len(ids) + verdict.accepted)
            drafter.observe(verdict.accepted)
            emitted = [*draft.tokens[: verdict.accepted], verdict.token]
            ids.extend(emitted)
            reason = self._stop_reason(ids, prompt_length, len(emitted), stop)
            if reason:
                stop_reason = reason
                break
        sync()
        stats.seconds = clock() - began
        new_ids = ids[prompt_length:][: self._cut_length(ids, prompt_length, stop)]
        stats.new_tokens = len(new_ids)
        text = self.verifier.tokenizer.decode(new_ids, skip_special_tokens=True)
        return Generation(token_ids=new_ids, text=text, stats=stats, stop_reason=stop_reason)

    @staticmethod
    def _judge(draft, logits, ids, processor: LogitsProcessor, generator) -> Verdict:
        context = [*ids, *draft.tokens]
        start = len(ids)
        if processor.config.greedy:
            return greedy_verdict(draft.tokens, processor.greedy_tokens(logits, context, start))
        target_probs = processor.probs(logits, context, start)
        return rejection_verdict(draft.tokens, draft.probs, target_probs, generator)

    def _stop_reason(self, ids, prompt_length, emitted, stop: StopConditions) -> str | None:
        # Only the tokens emitted this step can end the sequence; no copy of the output per step.
        if any(token in stop.eos_token_ids for token in ids[-emitted:]):
            return "eos"
        if stop.stop_strings and self._stop_string_end(ids[prompt_length:], stop) is not None:
            return "stop_string"
        if len(ids) - prompt_length >= stop.max_new_tokens:
            return "length"
        return None

    def _cut_length(self, ids, prompt_length, stop: StopConditions) -> int:
        """How many generated tokens to keep: up to and including the first EOS or the token
        that completes a stop string, and never more than max_new_tokens."""
        new = ids[prompt_length:]
        keep = min(len(new), stop.max_new_tokens)
        for i, token in enumerate(new[:keep]):
            if token in stop.eos_token_ids:
                keep = i + 1
                break
        if stop.stop_strings:
            end = self._stop_string_end(new[:keep], stop)
            if end is not None:
                keep = end
        return keep

    def _stop_string_end(self, new: list[int], stop: StopConditions) -> int | None:
        """Length of the shortest prefix of `new` whose text contains a stop string."""
        decode = self.verifier.tokenizer.decode
        if not any(s in decode(new, skip_special_tokens=True) for s in stop.stop_strings):
            return None
        for end in range(1, len(new) + 1):
            text = decode(new[:end], skip_special_tokens=True)
            if any(s in text for s in stop.stop_strings):
                return end
        return None
