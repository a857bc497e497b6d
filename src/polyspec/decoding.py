"""Plain and speculative decoding: one loop, where plain decoding is the empty draft.

Each step feeds the pending token plus the draft to the verifier in one forward, turns the
k + 1 rows of logits into choices with the shared `LogitsProcessor`, keeps the accepted draft
tokens and the verifier's own next token, and cuts the cache back to what was kept. With
`NoDrafter` every step is an ordinary single-token decoding step through the same code, so
timings compare like with like.

A token tree (`tree=N`) is a kind of draft: the pending token and the tree's nodes go through
one forward in which each node sees the cache and its own ancestors, acceptance walks down the
tree (`polyspec.acceptance`), and the cache keeps the accepted path (`CachedLM.keep`).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass

import torch

from polyspec.acceptance import greedy_tree_verdict, greedy_verdict, rejection_verdict, tree_rejection_verdict
from polyspec.cached_lm import CachedLM
from polyspec.drafters.base import Drafter, NoDrafter, can_branch
from polyspec.errors import UserError
from polyspec.models import LoadedModel, synchronizer
from polyspec.sampling import LogitsProcessor, SamplingConfig
from polyspec.tree import TokenTree
from polyspec.types import EMPTY_DRAFT, Draft, Generation, GenerationStats, Verdict


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


def check_tree(tree: int, gamma: int) -> None:
    """A tree budget (0: chains) must hold a full-depth chain: at least gamma nodes."""
    if tree < 0:
        raise UserError(f"tree budget must be >= 0, got {tree}")
    if tree and tree < gamma:
        raise UserError(f"a tree of {tree} nodes cannot reach depth gamma = {gamma}: use --tree >= {gamma}")


class Decoder:
    """Generates from one verifier with any drafter; reusable across prompts."""

    def __init__(self, verifier: LoadedModel) -> None:
        self.verifier = verifier
        self.lm = CachedLM(verifier.model)
        self._synchronize = synchronizer(verifier.device)

    def check_tree_support(self, tree: int) -> None:
        """A tree budget needs a verifier that takes token trees (hybrid models: chains only)."""
        if tree and (reason := self.lm.tree_support()) is not None:
            raise UserError(f"{reason} (drop --tree)")

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

    def generate(self, prompt_ids: Sequence[int], drafter: Drafter | None = None, **options) -> Generation:
        """Decode to the end; takes the same options as `stream`."""
        steps = self.stream(prompt_ids, drafter, **options)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def stream(
        self,
        prompt_ids: Sequence[int],
        drafter: Drafter | None = None,
        gamma: int = 3,
        sampling: SamplingConfig = SamplingConfig(),
        max_new_tokens: int = 64,
        stop_strings: Sequence[str] = (),
        seed: int = 0,
        eos_token_ids: frozenset[int] | None = None,
        tree: int = 0,
    ) -> Generator[list[int], None, Generation]:
        """Yields the tokens each verifier call adds (never past a stop), then returns the
        `Generation`. Nothing runs until the first `next`. `tree` > 0 drafts token trees of up to
        that many nodes and gamma levels (0: chains of gamma tokens)."""
        drafter = drafter or NoDrafter()
        check_budget(gamma, max_new_tokens)
        check_tree(tree, gamma)
        self.check_tree_support(tree)
        if tree and not can_branch(drafter):
            raise UserError(
                f"{type(drafter).__name__} drafts chains only: drop --tree or choose a drafter that branches"
            )
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
        return self._run(list(prompt_ids), drafter, gamma, tree, processor, generator, stop)

    def _run(self, ids, drafter, gamma, tree, processor, generator, stop) -> Generator[list[int], None, Generation]:
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
        stop_reason = None
        while stop_reason is None:
            new_count = len(ids) - prompt_length
            # Never draft past the budget: k accepted tokens plus the verifier's own make k + 1.
            k = min(gamma, stop.max_new_tokens - new_count - 1)
            t0 = clock()
            if k <= 0:
                draft = EMPTY_DRAFT
            elif tree:
                draft = drafter.propose_tree(ids, tree, k)
            else:
                draft = drafter.propose(ids, k)
            sync()
            t1 = clock()
            verdict, judged = self._verify(draft, ids, processor, generator)
            sync()
            t2 = clock()
            stats.draft_seconds += t1 - t0
            stats.verify_seconds += t2 - t1
            stats.verifier_calls += 1
            stats.nodes_verified += len(draft) + 1
            stats.record(len(draft), verdict.accepted, judged)
            emitted = [*(draft.tokens[i] for i in verdict.kept), verdict.token]
            keep, stop_reason = self._stop(ids[prompt_length:], emitted, stop)
            ids.extend(emitted)
            if keep:
                stats.new_tokens += keep
                stats.seconds = clock() - began
                yield emitted[:keep]
        sync()
        stats.seconds = clock() - began
        new_ids = ids[prompt_length:][: stats.new_tokens]
        text = self.verifier.tokenizer.decode(new_ids, skip_special_tokens=True)
        return Generation(token_ids=new_ids, text=text, stats=stats, stop_reason=stop_reason)

    def _verify(self, draft: Draft | TokenTree, ids, processor, generator) -> tuple[Verdict, int]:
        """One verifier forward over the pending token and the draft, the verdict, and the cache
        cut to what was kept; also returns how many draft levels were judged."""
        if isinstance(draft, Draft) or draft.is_chain:
            probs = draft.probs
            logits = self.lm.forward([ids[-1], *draft.tokens])
            verdict = self._judge_chain(draft.tokens, probs, logits, ids, processor, generator)
            self.lm.rollback(len(ids) + verdict.accepted)
            return verdict, min(len(draft), verdict.accepted + 1)
        logits = self.lm.forward([ids[-1], *draft.tokens], parents=draft.forward_parents())
        suffixes = [[], *(draft.path_tokens(node) for node in range(len(draft)))]
        if processor.config.greedy:
            verdict = greedy_tree_verdict(draft, processor.greedy_after(logits, ids, suffixes))
        else:
            # Rows are processed (a top-k over the vocabulary each) only along the walk.
            def row(i: int) -> torch.Tensor:
                return processor.probs_after(logits[i : i + 1], ids, suffixes[i : i + 1])[0]

            verdict = tree_rejection_verdict(draft, row, generator)
        self.lm.keep([0, *(node + 1 for node in verdict.kept)])
        last = verdict.path[-1] if verdict.path else -1
        return verdict, verdict.accepted + bool(draft.children(last))

    @staticmethod
    def _judge_chain(tokens, probs, logits, ids, processor: LogitsProcessor, generator) -> Verdict:
        start = len(ids)
        if processor.config.greedy:
            return greedy_verdict(tokens, processor.greedy_tokens(logits, ids, start, tokens))
        target_probs = processor.probs(logits, ids, start, tokens)
        return rejection_verdict(tokens, probs, target_probs, generator)

    def _stop(self, before: list[int], emitted: list[int], stop: StopConditions) -> tuple[int, str | None]:
        """How many of `emitted` (following the generated tokens `before`) to keep, and why the
        sequence ends there (None: it goes on). Kept: up to and including the first EOS or the
        token that completes a stop string, never past max_new_tokens."""
        keep = min(len(emitted), stop.max_new_tokens - len(before))
        reason = "length" if keep < len(emitted) or len(before) + keep == stop.max_new_tokens else None
        for i, token in enumerate(emitted[:keep]):
            if token in stop.eos_token_ids:
                keep, reason = i + 1, "eos"
                break
        if stop.stop_strings:
            end = self._stop_string_end(before, emitted[:keep], stop.stop_strings)
            if end is not None:
                keep, reason = end, "stop_string"
        return keep, reason

    def _stop_string_end(self, before: list[int], new: list[int], stop_strings: tuple[str, ...]) -> int | None:
        """The fewest tokens of `new` after which the text contains a stop string that the text
        of `before` did not. Only a tail of `before` is decoded: a stop string of n characters
        spans at most 4n tokens (byte-level tokens of 4-byte characters)."""
        decode = self.verifier.tokenizer.decode
        tail = before[-4 * max(map(len, stop_strings)) - 4 :]

        def found(end: int) -> bool:
            text = decode([*tail, *new[:end]], skip_special_tokens=True)
            return any(s in text for s in stop_strings)

        if not found(len(new)):
            return None
        return next(end for end in range(1, len(new) + 1) if found(end))
