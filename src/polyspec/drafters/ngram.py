"""The n-gram drafter: drafts from counts of a corpus, optionally with the sequence's own n-grams.

Options (spec: ngram:PATH[+context][?backoff=none&min_prob=0.2&context_order=4], `polyspec.specs`):

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

Token trees (greedy or sampling alike): the children of a node are its most probable
continuations, point masses chosen without randomness, and the tree grows best-first by
estimated path probability. With +context both sources propose: their distributions are mixed,
each weighted by the length of the context it matched plus one. Candidates below min_prob are
left out, and an unseen context without back-off has no children. When the verifier samples,
`propose_sampled_tree` draws a tree instead: a fixed number of independent draws under every
node from that node's row (what the router's sampled policies send).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from polyspec.tree import EMPTY_TREE, TokenTree, best_first
from polyspec.types import EMPTY_DRAFT, Draft

ROOT = (0, 0)  # the model's state for the empty context: depth 0, node 0


@dataclass(frozen=True)
class NGramOptions:
    use_context: bool = False
    backoff: bool = True
    min_prob: float = 0.0
    context_order: int = 4


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


class NGramDrafter:
    def __init__(self, model, vocab_size: int, options: NGramOptions) -> None:
        self.model = model
        model.prepare()  # now, so a damaged model fails before generation starts
        self.vocab_size = vocab_size  # the verifier's: width of Draft.probs rows
        self.options = options
        # Token ids the drafter may propose: both vocabularies hold them.
        self.usable_vocab = min(vocab_size, model.vocab_size)
        self.cache = ContextCache(options.context_order - 1) if options.use_context else None
        self.greedy = True
        self.generator: torch.Generator | None = None
        self._reset()

    def _reset(self) -> None:
        # The model's state at the end of the accepted text, advanced by the tokens added since
        # the last proposal; drafted tokens move a copy of it.
        self._state = ROOT
        self._fed = 0
        self._last = -1
        self._large: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray, float]] = {}
        self._top: dict[tuple[int, int], tuple[bool, list[tuple[int, float]]]] = {}  # (all?, best first)
        if self.cache is not None:
            self.cache = ContextCache(self.cache.max_context)

    def start(self, prompt_ids, processor, generator) -> None:
        self.greedy = processor.config.greedy
        self.generator = generator
        self._reset()

    def _advance(self, context: Sequence[int]) -> None:
        fed = self._fed
        if fed and (len(context) < fed or context[fed - 1] != self._last):
            fed = 0  # not a continuation of what was seen: start over
        if fed == 0:
            self._state = self.model.state(context)
        else:
            depth, node = self._state
            step = self.model.step
            for token in context[fed:]:
                depth, node = step(depth, node, token)
            self._state = (depth, node)
        self._fed, self._last = len(context), context[-1]
        if self.cache is not None:
            self.cache.sync(context)

    def propose(self, context: Sequence[int], k: int) -> Draft:
        if k <= 0 or not context:
            return EMPTY_DRAFT
        self._advance(context)
        if self.greedy and self.cache is None:
            options = self.options
            tokens = self.model.greedy_draft(*self._state, k, options.backoff, options.min_prob, self.usable_vocab)
            return Draft(tokens=tokens)
        window = list(context[-self.cache.max_context :]) if self.cache is not None else []
        if self.greedy:
            return self._propose_greedy_with_context(window, k)
        return self._propose_sampled(window, k)

    def _choose(self, state: tuple[int, int], window: list[int]):
        """The source that predicts the next token: ('static', depth, node) or ('live', length,
        entry); the longer matched context wins, then the more confident one, then the live
        one. None when neither has a prediction."""
        found = self.model.predictor(*state, backoff=self.options.backoff)
        if self.cache is None:
            return None if found is None else ("static", *found)
        table = self.cache.table
        for length in range(min(self.cache.max_context, len(window)), 0, -1):
            entry = table.get(tuple(window[-length:]))
            if entry is not None:
                break
        else:
            return None if found is None else ("static", *found)
        if found is None or length > found[0]:
            return "live", length, entry
        if length < found[0] or entry[1] / entry[2] < self.model.best(*found)[1]:
            return ("static", *found)
        return "live", length, entry

    def _propose_greedy_with_context(self, window: list[int], k: int) -> Draft:
        model, min_prob, usable = self.model, self.options.min_prob, self.usable_vocab
        best, step, choose, longest = model.best, model.step, self._choose, self.cache.max_context
        state = self._state
        tokens: list[int] = []
        for _ in range(k):
            choice = choose(state, window)
            if choice is None:
                break
            if choice[0] == "static":
                token, prob = best(choice[1], choice[2])
            else:
                entry = choice[2]
                token, prob = entry[0], entry[1] / entry[2]
            if prob < min_prob or token >= usable:
                break
            tokens.append(token)
            state = step(*state, token)
            window.append(token)
            if len(window) > longest:
                del window[0]
        return Draft(tokens=tokens)

    def _distribution(self, state, window: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, float] | None:
        """(token ids, float32 probabilities, their float64 running sum, the largest probability
        computed exactly) to draw the next token from; None means uniform. Long rows (the
        unigram one) are kept: rebuilding one costs about a millisecond."""
        choice = self._choose(state, window)
        if choice is None:
            return None
        if choice[0] == "static":
            key = (choice[1], choice[2])
            if key in self._large:
                return self._large[key]
            ids, counts = self.model.continuations(*key)
        else:
            key = None
            by_token = choice[2][3]
            ids = np.fromiter(by_token.keys(), dtype=np.int64, count=len(by_token))
            counts = np.fromiter(by_token.values(), dtype=np.int64, count=len(by_token))
        ids = ids.astype(np.int64)
        keep = ids < self.usable_vocab
        if not keep.all():
            ids, counts = ids[keep], counts[keep]
            if len(ids) == 0:
                return None
        counts = counts.astype(np.float64)
        total = counts.sum()
        probs = (counts / total).astype(np.float32)
        result = ids, probs, np.cumsum(probs, dtype=np.float64), float(counts.max() / total)
        if key is not None and len(ids) > 4096:
            if len(self._large) > 64:
                self._large.clear()
            self._large[key] = result
        return result

    def _uniform(self) -> float:
        """One uniform draw in [0, 1) from the generator the engine seeded."""
        generator = self.generator
        device = generator.device if generator is not None else "cpu"
        return float(torch.rand((), generator=generator, device=device))

    def _propose_sampled(self, window: list[int], k: int) -> Draft:
        # Rows are filled in numpy: a zeroed [k, V] array costs nothing until written, while
        # small torch ops pay thread-pool overhead that dominates on a busy machine.
        rows = np.zeros((k, self.vocab_size), dtype=np.float32)
        usable, min_prob = self.usable_vocab, self.options.min_prob
        state = self._state
        tokens: list[int] = []
        for i in range(k):
            distribution = self._distribution(state, window)
            if distribution is None:
                # The study's fallback for an unseen context: uniform over the vocabulary.
                if 1.0 / usable < min_prob:
                    break
                rows[i, :usable] = 1.0 / usable
                token = min(int(self._uniform() * usable), usable - 1)
            else:
                ids, probs, cumulative, peak = distribution
                if peak < min_prob:
                    break
                rows[i, ids] = probs
                token = self._draw(ids, cumulative)
            tokens.append(token)
            state = self.model.step(*state, token)
            if self.cache is not None:
                window.append(token)
                if len(window) > self.cache.max_context:
                    del window[0]
        if not tokens:
            return EMPTY_DRAFT
        return Draft(tokens=tokens, probs=self._on_device(rows[: len(tokens)]))

    def _draw(self, ids: np.ndarray, cumulative: np.ndarray) -> int:
        """One token drawn from the very values handed to the verifier (inverse CDF of the row)."""
        pick = int(np.searchsorted(cumulative, self._uniform() * cumulative[-1], side="right"))
        return int(ids[min(pick, len(ids) - 1)])

    def _on_device(self, rows: np.ndarray) -> torch.Tensor:
        """Draft rows as a tensor where the engine samples."""
        probs = torch.from_numpy(rows)
        if self.generator is not None and self.generator.device.type != "cpu":
            probs = probs.to(self.generator.device)
        return probs

    def propose_sampled_tree(self, context: Sequence[int], widths: Sequence[int]) -> TokenTree:
        """A tree of independent draws (the SpecInfer setting, sampling only): every node at
        depth d gets widths[d] children drawn from its own row. A child repeating an earlier
        sibling's token stays a leaf: it is tried only once that token was rejected, and then
        it is rejected too, so nothing below it could be kept. A node whose context has no
        counts (or whose most probable token is below min_prob) gets no children."""
        if not widths or not context:
            return EMPTY_TREE
        self._advance(context)
        longest = self.cache.max_context if self.cache is not None else 0
        base = list(context[-longest:]) if longest else []
        tokens: list[int] = []
        parents: list[int] = []
        rows: list[tuple[np.ndarray, np.ndarray]] = []
        level = [(-1, self._state, [])]  # (node, n-gram state, drafted path) to grow
        for width in widths:
            grown = []
            for node, state, path in level:
                window = [*base, *path][-longest:] if longest else []
                distribution = self._distribution(state, window)
                if distribution is None or distribution[3] < self.options.min_prob:
                    continue
                ids, probs, cumulative, _ = distribution
                drawn = set()
                for _ in range(width):
                    token = self._draw(ids, cumulative)
                    tokens.append(token)
                    parents.append(node)
                    rows.append((ids, probs))
                    if token not in drawn:
                        drawn.add(token)
                        grown.append((len(tokens) - 1, self.model.step(*state, token), [*path, token]))
            level = grown
        if not tokens:
            return EMPTY_TREE
        table = np.zeros((len(tokens), self.vocab_size), dtype=np.float32)
        for i, (ids, probs) in enumerate(rows):
            table[i, ids] = probs
        return TokenTree(tokens=tokens, parents=parents, probs=self._on_device(table))

    # Token trees.

    def _static_top(self, found: tuple[int, int], limit: int) -> list[tuple[int, float]]:
        """The `limit` most probable usable continuations of a context node (ties: smaller id)."""
        cached = self._top.get(found)
        if cached is not None and (cached[0] or len(cached[1]) >= limit):
            return cached[1][:limit]
        ids, counts = self.model.continuations(*found)
        counts = counts.astype(np.int64)
        total = int(counts.sum())
        keep = ids < self.usable_vocab
        ids, counts = ids[keep].astype(np.int64), counts[keep]
        size = max(limit, 16)
        complete = len(ids) <= size
        if not complete:
            part = np.argpartition(-counts, size - 1)[:size]
            ids, counts = ids[part], counts[part]
        top = [(int(ids[i]), int(counts[i]) / total) for i in np.lexsort((ids, -counts))]
        if len(self._top) > 4096:
            self._top.clear()
        self._top[found] = (complete, top)
        return top[:limit]

    def _live_top(self, window: list[int], limit: int) -> tuple[int, list[tuple[int, float]]]:
        """(matched length, most probable continuations) in the live cache; (0, []) for none."""
        table = self.cache.table
        for length in range(min(self.cache.max_context, len(window)), 0, -1):
            entry = table.get(tuple(window[-length:]))
            if entry is not None:
                best, total = entry[0], entry[2]
                ranked = sorted(entry[3].items(), key=lambda item: (-item[1], item[0] != best))
                return length, [(t, c / total) for t, c in ranked[:limit] if t < self.usable_vocab]
        return 0, []

    def _candidates(self, state, window: list[int] | None, limit: int) -> list[tuple[int, float]]:
        found = self.model.predictor(*state, backoff=self.options.backoff)
        static = self._static_top(found, limit) if found is not None else []
        if window is None:
            mixed = static
        else:
            length, live = self._live_top(window, limit)
            if not live or not static:
                mixed = live or static
            else:
                weights = {"live": length + 1.0, "static": found[0] + 1.0}
                total = weights["live"] + weights["static"]
                scores: dict[int, float] = {}
                for source, pairs in (("live", live), ("static", static)):
                    for token, prob in pairs:
                        scores[token] = scores.get(token, 0.0) + prob * weights[source] / total
                mixed = sorted(scores.items(), key=lambda item: -item[1])
        min_prob = self.options.min_prob
        return [(t, p) for t, p in mixed if p >= min_prob][:limit]

    def propose_tree(self, context: Sequence[int], budget: int, max_depth: int) -> TokenTree:
        if budget <= 0 or max_depth <= 0 or not context:
            return EMPTY_TREE
        self._advance(context)
        states = {(): self._state}
        longest = self.cache.max_context if self.cache is not None else 0
        base = list(context[-longest:]) if longest else []

        def expand(node: int, path: list[int], limit: int) -> list[tuple[int, float]]:
            key = tuple(path)
            state = states.get(key)
            if state is None:
                state = states[key] = self.model.step(*states[key[:-1]], key[-1])
            window = [*base, *path][-longest:] if self.cache is not None else None
            return self._candidates(state, window, limit)

        return best_first(expand, budget, max_depth)
