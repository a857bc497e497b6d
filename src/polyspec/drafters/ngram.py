"""The n-gram drafter: drafts from counts of a corpus, optionally with the sequence's own n-grams.

Spec: ngram:PATH[+context][?backoff=none&min_prob=0.2&context_order=4]

  PATH         a model file from `polyspec ngram train` (its tokenizer must be the verifier's)
  +context     also count the n-grams of the current prompt and output (a live cache kept
               up to date in O(new tokens)); per step the match with the longer context wins,
               then the more confident one, then the live one
  backoff      longest (default): use the longest suffix of the context seen in the corpus;
               none: the study's unsmoothed model, only the full order-1 token context counts
               and an unseen one is uniform over the vocabulary
  min_prob     end the draft when the most probable next token is less likely than this
               (decided before drawing, so sampling stays exact); default 0
  context_order  order of the live cache's n-grams with +context (default 4: up to 3 tokens)

Greedy verification: each step proposes the most probable continuation. An unseen context
without back-off ends the draft: the uniform distribution has no meaningful argmax, and a
guess accepted with chance 1/V only widens the verifier call.
Sampling verification: each step draws from the chosen context's maximum-likelihood
distribution (uniform for an unseen context without back-off) and returns those rows as
Draft.probs, so rejection sampling keeps the verifier's output distribution exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl

import numpy as np
import torch

from polyspec.errors import UserError
from polyspec.ngram import MAX_ORDER
from polyspec.ngram.query import NGramModel
from polyspec.types import EMPTY_DRAFT, Draft

SPEC_GRAMMAR = "ngram:PATH[+context][?backoff=none&min_prob=0.2&context_order=4]"
_CONTEXT_SUFFIX = "+context"


@dataclass(frozen=True)
class NGramOptions:
    path: str
    use_context: bool = False
    backoff: bool = True
    min_prob: float = 0.0
    context_order: int = 4


def parse_argument(argument: str) -> NGramOptions:
    """The part of the spec after 'ngram:'."""
    if not argument:
        raise UserError(f"drafter 'ngram' needs a model file: {SPEC_GRAMMAR}")
    path, query = argument, ""
    if "?" in argument:
        path, _, query = argument.rpartition("?")
    use_context = path.endswith(_CONTEXT_SUFFIX)
    if use_context:
        path = path[: -len(_CONTEXT_SUFFIX)]
    if not path:
        raise UserError(f"drafter 'ngram' needs a model file: {SPEC_GRAMMAR}")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True) if query else []
    except ValueError as exc:
        raise UserError(f"cannot parse n-gram drafter options {query!r}: use {SPEC_GRAMMAR}") from exc
    settings: dict[str, str] = {}
    for key, value in pairs:
        if key in settings:
            raise UserError(f"n-gram drafter option {key!r} given twice")
        settings[key] = value
    unknown = set(settings) - {"backoff", "min_prob", "context_order"}
    if unknown:
        raise UserError(f"unknown n-gram drafter option {sorted(unknown)[0]!r}: use backoff, min_prob or context_order")
    backoff = settings.get("backoff", "longest")
    if backoff not in ("longest", "none"):
        raise UserError(f"n-gram drafter backoff must be longest or none, got {backoff!r}")
    min_prob = _number(settings.get("min_prob", "0"), "min_prob", float)
    if not 0.0 <= min_prob <= 1.0:
        raise UserError(f"n-gram drafter min_prob must be in [0, 1], got {min_prob}")
    context_order = _number(settings.get("context_order", "4"), "context_order", int)
    if not 2 <= context_order <= MAX_ORDER:
        raise UserError(f"n-gram drafter context_order must be between 2 and {MAX_ORDER}, got {context_order}")
    return NGramOptions(path, use_context, backoff == "longest", min_prob, context_order)


def _number(text: str, name: str, kind):
    try:
        return kind(text)
    except ValueError as exc:
        raise UserError(f"n-gram drafter {name} must be a number, got {text!r}") from exc


class ContextCache:
    """Counts of the n-grams of one sequence (prompt and accepted output), updated with the
    tokens added since the last call. Each context maps to [best token, its count, total,
    counts by token]; ties go to the latest token, as prompt lookup prefers recent matches."""

    def __init__(self, max_context: int) -> None:
        self.max_context = max_context
        self.tokens: list[int] = []
        self.table: dict[tuple[int, ...], list] = {}

    def sync(self, context: Sequence[int]) -> None:
        known = len(self.tokens)
        if len(context) < known or (known and context[known - 1] != self.tokens[-1]):
            self.tokens, self.table, known = [], {}, 0  # not a continuation: start over
        tokens, table = self.tokens, self.table
        for position in range(known, len(context)):
            token = context[position]
            tokens.append(token)
            for length in range(1, min(self.max_context, position) + 1):
                key = tuple(tokens[position - length : position])
                entry = table.get(key)
                if entry is None:
                    table[key] = [token, 1, 1, {token: 1}]
                    continue
                count = entry[3].get(token, 0) + 1
                entry[3][token] = count
                entry[2] += 1
                if count >= entry[1]:
                    entry[0], entry[1] = token, count

    def match(self, window: Sequence[int]) -> tuple[int, list] | None:
        """(context length, entry) of the longest suffix of `window` seen in the sequence."""
        table = self.table
        for length in range(min(self.max_context, len(window)), 0, -1):
            entry = table.get(tuple(window[-length:]))
            if entry is not None:
                return length, entry
        return None


class NGramDrafter:
    def __init__(self, model: NGramModel, vocab_size: int, options: NGramOptions) -> None:
        self.model = model
        self.vocab_size = vocab_size  # the verifier's: width of Draft.probs rows
        self.options = options
        # Token ids the drafter may propose: both vocabularies hold them.
        self.usable_vocab = min(vocab_size, model.vocab_size)
        self.cache = ContextCache(options.context_order - 1) if options.use_context else None
        self.window = max(model.max_context, self.cache.max_context if self.cache else 0)
        self.greedy = True
        self.generator: torch.Generator | None = None

    def start(self, prompt_ids, processor, generator) -> None:
        self.greedy = processor.config.greedy
        self.generator = generator
        if self.cache is not None:
            self.cache = ContextCache(self.cache.max_context)

    def observe(self, num_accepted: int) -> None:
        pass

    def _choose(self, window: list[int]):
        """The source that predicts the next token: ('static', depth, node) or ('live', length,
        entry), longer context first, then higher confidence, then live; None if neither."""
        found = self.model.context_node(window, self.options.backoff)
        live = self.cache.match(window) if self.cache is not None else None
        if live is None:
            return None if found is None else ("static", *found)
        if found is None:
            return ("live", *live)
        depth, node = found
        length, entry = live
        if length != depth:
            return ("live", *live) if length > depth else ("static", *found)
        static_prob = self.model.best(depth, node)[1]
        return ("live", *live) if entry[1] / entry[2] >= static_prob else ("static", *found)

    def propose(self, context: Sequence[int], k: int) -> Draft:
        if k <= 0:
            return EMPTY_DRAFT
        if self.cache is not None:
            self.cache.sync(context)
        window = list(context[-self.window :]) if self.window else []
        if self.greedy:
            return self._propose_greedy(window, k)
        return self._propose_sampled(window, k)

    def _propose_greedy(self, window: list[int], k: int) -> Draft:
        model, min_prob, usable = self.model, self.options.min_prob, self.usable_vocab
        backoff, size = self.options.backoff, self.window
        tokens: list[int] = []
        for _ in range(k):
            if self.cache is None:
                found = model.context_node(window, backoff)
                if found is None:
                    break
                token, prob = model.best(*found)
            else:
                choice = self._choose(window)
                if choice is None:
                    break
                if choice[0] == "static":
                    token, prob = model.best(choice[1], choice[2])
                else:
                    entry = choice[2]
                    token, prob = entry[0], entry[1] / entry[2]
            if prob < min_prob or token >= usable:
                break
            tokens.append(token)
            if size:
                window.append(token)
                if len(window) > size:
                    del window[0]
        return Draft(tokens=tokens)

    def _distribution(self, window: list[int]) -> tuple[np.ndarray, np.ndarray] | None:
        """(token ids, float64 probabilities) to draw the next token from; None means uniform."""
        choice = self._choose(window)
        if choice is None:
            return None
        if choice[0] == "static":
            tokens, counts = self.model.continuations(choice[1], choice[2])
            tokens, counts = tokens.astype(np.int64), counts.astype(np.float64)
        else:
            by_token = choice[2][3]
            tokens = np.fromiter(by_token.keys(), dtype=np.int64, count=len(by_token))
            counts = np.fromiter(by_token.values(), dtype=np.float64, count=len(by_token))
        keep = tokens < self.usable_vocab
        if not keep.all():
            tokens, counts = tokens[keep], counts[keep]
            if len(tokens) == 0:
                return None
        return tokens, counts / counts.sum()

    def _uniform(self) -> float:
        """One uniform draw in [0, 1) from the generator the engine seeded."""
        generator = self.generator
        device = generator.device if generator is not None else "cpu"
        return float(torch.rand((), generator=generator, device=device))

    def _propose_sampled(self, window: list[int], k: int) -> Draft:
        # Rows are filled in numpy: a zeroed [k, V] array costs nothing until written, while
        # small torch ops pay thread-pool overhead that dominates on a busy machine.
        rows = np.zeros((k, self.vocab_size), dtype=np.float32)
        size, usable, min_prob = self.window, self.usable_vocab, self.options.min_prob
        tokens: list[int] = []
        for i in range(k):
            distribution = self._distribution(window)
            if distribution is None:
                # The study's fallback for an unseen context: uniform over the vocabulary.
                if 1.0 / usable < min_prob:
                    break
                rows[i, :usable] = 1.0 / usable
                token = min(int(self._uniform() * usable), usable - 1)
            else:
                ids, probs = distribution
                if probs.max() < min_prob:
                    break
                row_probs = probs.astype(np.float32)
                rows[i, ids] = row_probs
                # Draw from the very values handed to the verifier (inverse CDF of the row).
                cumulative = np.cumsum(row_probs, dtype=np.float64)
                pick = int(np.searchsorted(cumulative, self._uniform() * cumulative[-1], side="right"))
                token = int(ids[min(pick, len(ids) - 1)])
            tokens.append(token)
            if size:
                window.append(token)
                if len(window) > size:
                    del window[0]
        if not tokens:
            return EMPTY_DRAFT
        probs = torch.from_numpy(rows[: len(tokens)])
        if self.generator is not None and self.generator.device.type != "cpu":
            probs = probs.to(self.generator.device)
        return Draft(tokens=tokens, probs=probs)


def make(argument: str, verifier) -> NGramDrafter:
    from polyspec.ngram.storage import load
    from polyspec.ngram.tokenize import tokenizer_fingerprint

    options = parse_argument(argument)
    stored = load(options.path)
    expected = tokenizer_fingerprint(verifier.tokenizer)
    if stored.fingerprint != expected:
        raise UserError(
            f"n-gram model {options.path!r} was trained with another tokenizer "
            f"({stored.fingerprint.describe()}) than the verifier {verifier.name!r} uses "
            f"({expected.describe()})"
        )
    return NGramDrafter(NGramModel(stored), verifier.vocab_size, options)
