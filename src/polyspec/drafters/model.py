"""A smaller causal LM with the verifier's tokenizer as drafter.

It keeps its own cache, cut back to the longest prefix it shares with the accepted context,
and drafts k tokens one forward at a time. When the verifier samples, the drafter samples from
its own logits processed exactly as the verifier's are (same temperature, top-k, top-p and
repetition penalty) and hands over that distribution, so rejection sampling stays exact.

Token trees grow one level per drafter forward: the forward feeds the tree's expanded nodes at
once, each seeing its own ancestors, and gives the children of every node of the deepest level.
The `width` most probable nodes of a level are expanded, each into its `width` most probable
next tokens (point masses, in greedy and sampling mode alike), unless its estimated path
probability cannot reach the budget's best; the tree is then the `budget` candidates of highest
path probability. A draft model that cannot take trees (recurrent layers) drafts a chain.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from polyspec.cached_lm import CachedLM
from polyspec.models import LoadedModel
from polyspec.sampling import LogitsProcessor, sample
from polyspec.tree import EMPTY_TREE, ROOT, TokenTree, select_by_score
from polyspec.types import EMPTY_DRAFT, Draft


class ModelDrafter:
    def __init__(self, draft: LoadedModel, vocab_size: int, width: int = 4) -> None:
        self.lm = CachedLM(draft.model)
        self.vocab_size = vocab_size  # the verifier's: draft rows are cut or padded to it
        self.width = width  # token trees: nodes expanded per level, children per node
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

    def propose_tree(self, context: Sequence[int], budget: int, max_depth: int) -> TokenTree:
        if budget <= 0 or max_depth <= 0:
            return EMPTY_TREE
        if self.lm.tree_support() is not None:
            chain = self.propose(context, min(budget, max_depth))
            return TokenTree.chain(chain.tokens, chain.probs)
        context = list(context)
        # The cache holds all but the last context token, which roots every level's forward.
        shared = 0
        limit = min(len(self._fed), len(context) - 1)
        while shared < limit and self._fed[shared] == context[shared]:
            shared += 1
        self.lm.rollback(shared)
        if shared < len(context) - 1:
            self.lm.forward(context[shared:-1], num_logits=1)
        self._fed = context[:-1]
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        paths: list[list[int]] = []
        expanded: list[int] = []  # candidate nodes fed to the forwards, in topological order
        frontier = [ROOT]
        for _ in range(max_depth):
            rows = self._level(context, expanded, parents, tokens, frontier, paths)
            level = []
            for node, row in zip(frontier, rows, strict=True):
                base = 1.0 if node == ROOT else scores[node]
                top = torch.topk(row, min(self.width, budget))
                for prob, token in zip(top.values.tolist(), top.indices.tolist(), strict=True):
                    if prob <= 0:
                        break
                    level.append(len(tokens))
                    tokens.append(token)
                    parents.append(node)
                    scores.append(base * prob)
                    paths.append([*(paths[node] if node != ROOT else []), token])
            # Only nodes that can still be among the budget's best are worth expanding.
            bar = sorted(scores, reverse=True)[budget - 1] if len(scores) >= budget else 0.0
            frontier = sorted(level, key=lambda i: -scores[i])[: self.width]
            frontier = [i for i in frontier if scores[i] > bar]
            if not frontier:
                break
            expanded.extend(sorted(frontier))
        chosen_tokens, chosen_parents, chosen_scores, _ = select_by_score(tokens, parents, scores, budget)
        return TokenTree(tokens=chosen_tokens, parents=chosen_parents, scores=chosen_scores)

    def _level(self, context, expanded, parents, tokens, frontier, paths) -> list[torch.Tensor]:
        """One forward over the last context token and the expanded nodes; the rows of next-token
        probabilities (ranking scores: the processed distribution) after each frontier node."""
        if frontier == [ROOT]:
            logits = self.lm.forward(context[-1:], num_logits=1)
            suffixes: list[list[int]] = [[]]
        else:
            position = {node: i + 1 for i, node in enumerate(expanded)}
            fed_parents = [-1, *(position.get(parents[node], 0) for node in expanded)]
            logits = self.lm.forward([context[-1], *(tokens[node] for node in expanded)], parents=fed_parents)
            logits = logits[[position[node] for node in frontier]]
            suffixes = [paths[node] for node in frontier]
        self.lm.rollback(len(context) - 1)
        logits = self._fit_vocab(logits)
        if self.processor.config.greedy:
            return list(torch.softmax(self.processor.penalize_after(logits, context, suffixes), dim=-1))
        return list(self.processor.probs_after(logits, context, suffixes))

    @classmethod
    def for_verifier(cls, draft: LoadedModel, verifier: LoadedModel) -> ModelDrafter:
        """A drafter whose ids mean what the verifier's mean, or a clear error."""
        from polyspec.vocabulary import fingerprint, require_same

        require_same(fingerprint(draft.tokenizer), verifier.tokenizer, f"drafter {draft.name!r}", verifier.name)
        return cls(draft, verifier.vocab_size)
