"""Token trees: drafts that branch, verified in one forward.

A tree draft is a flat list of nodes in topological order. Node i holds a token and the index of
its parent node (-1: it follows the context directly), so parents[i] < i; its depth is the
number of nodes on its root-to-node path. A chain is the tree whose node i has parent i - 1.

Draft distributions (what acceptance may assume):
- `probs is None`: every node is a point mass, chosen deterministically from the context; the
  children of a node then hold distinct tokens, tried in order without replacement.
- `probs` [n, V]: row i is the distribution node i was drawn from; the children of one node are
  independent draws from one shared row (the SpecInfer / SpecTr setting), so their rows agree.

`best_first` builds a tree from any ranking of next tokens: it grows the node of highest
estimated path probability first, within a node budget and a depth limit chosen per call, so an
outside policy can size each step's tree.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

ROOT = -1  # the parent of the nodes that follow the context directly


@dataclass(frozen=True)
class TokenTree:
    """Draft tokens that may branch. tokens[i] follows parents[i] (ROOT: the context's end)."""

    tokens: list[int]
    parents: list[int]
    probs: torch.Tensor | None = None
    # Estimated path probabilities the drafter ranked nodes by (optional, for policies and stats).
    scores: list[float] = field(default_factory=list, compare=False)

    def __post_init__(self) -> None:
        self.validate()

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def chain(cls, tokens: Sequence[int], probs: torch.Tensor | None = None) -> TokenTree:
        return cls(tokens=list(tokens), parents=list(range(-1, len(tokens) - 1)), probs=probs)

    @cached_property
    def depths(self) -> list[int]:
        """depths[i]: 1 for a child of the root, one more than its parent's otherwise."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent == ROOT else depths[parent] + 1)
        return depths

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)

    @cached_property
    def _children(self) -> dict[int, list[int]]:
        children: dict[int, list[int]] = {ROOT: []}
        for node, parent in enumerate(self.parents):
            children.setdefault(parent, []).append(node)
        return children

    def children(self, node: int) -> list[int]:
        """Child node indices of `node` (ROOT for the context's end), in draft order."""
        return self._children.get(node, [])

    def path(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node` (empty for ROOT)."""
        path = []
        while node != ROOT:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def path_tokens(self, node: int) -> list[int]:
        return [self.tokens[i] for i in self.path(node)]

    @property
    def is_chain(self) -> bool:
        return all(parent == i - 1 for i, parent in enumerate(self.parents))

    def forward_parents(self) -> list[int]:
        """Parents for one verifier forward over [pending token, *tokens]: node 0 is the pending
        token (parent -1) and draft node i is forward node i + 1."""
        return [-1, *(parent + 1 for parent in self.parents)]

    def validate(self) -> None:
        """Raises ValueError unless the nodes are topologically ordered, point-mass siblings are
        distinct, and the rows (if any) are [n, V] with siblings sharing one row."""
        if len(self.parents) != len(self.tokens):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.parents)} parents")
        for i, parent in enumerate(self.parents):
            if not ROOT <= parent < i:
                raise ValueError(f"node {i} has parent {parent}: parents must come first")
        if self.probs is None:
            for parent, kids in self._children.items():
                tokens = [self.tokens[k] for k in kids]
                if len(set(tokens)) != len(tokens):
                    raise ValueError(f"point-mass children of node {parent} repeat a token: {tokens}")
            return
        if self.probs.dim() != 2 or self.probs.shape[0] != len(self.tokens):
            raise ValueError(f"draft rows must be [{len(self.tokens)}, V], got {list(self.probs.shape)}")
        for kids in self._children.values():
            first = kids[0] if kids else None
            for other in kids[1:]:
                if not torch.equal(self.probs[first], self.probs[other]):
                    raise ValueError(f"siblings {first} and {other} were drawn from different rows")


EMPTY_TREE = TokenTree(tokens=[], parents=[])


# expand(node, path_tokens, limit) -> up to `limit` (token, probability) pairs, most probable
# first, for the children of `node` (ROOT: the context's end) whose path holds `path_tokens`.
Expand = Callable[[int, list[int], int], Sequence[tuple[int, float]]]


def best_first(expand: Expand, budget: int, max_depth: int) -> TokenTree:
    """The tree of up to `budget` nodes and `max_depth` levels grown by estimated path
    probability (the product of the probabilities `expand` gives along the path): the most
    probable candidate joins first, then its own children become candidates. Point masses:
    tokens repeated among one node's children are kept once (the first, most probable)."""
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    paths: list[list[int]] = []
    heap: list[tuple[float, int, int, int]] = []  # (-score, order, parent, token)
    order = 0

    def push_children(node: int, path: list[int], score: float) -> None:
        nonlocal order
        seen = set()
        for token, prob in expand(node, path, budget - len(tokens)):
            if prob <= 0 or token in seen:
                continue
            seen.add(token)
            heapq.heappush(heap, (-score * prob, order, node, token))
            order += 1

    if budget > 0 and max_depth > 0:
        push_children(ROOT, [], 1.0)
    while heap and len(tokens) < budget:
        negative, _, parent, token = heapq.heappop(heap)
        node = len(tokens)
        path = [*(paths[parent] if parent != ROOT else []), token]
        tokens.append(token)
        parents.append(parent)
        scores.append(-negative)
        paths.append(path)
        if len(path) < max_depth and len(tokens) < budget:
            push_children(node, path, -negative)
    return TokenTree(tokens=tokens, parents=parents, scores=scores)


def select_by_score(
    tokens: Sequence[int], parents: Sequence[int], scores: Sequence[float], budget: int
) -> tuple[list[int], list[int], list[float], list[int]]:
    """The `budget` candidates of highest score from a candidate tree whose scores never grow
    from parent to child (ties: shallower, then earlier): every chosen node's parent is chosen
    too. Returns the chosen nodes' tokens, re-indexed parents, scores and original indices, in
    topological order."""
    depth: list[int] = []
    for parent in parents:
        depth.append(1 if parent == ROOT else depth[parent] + 1)
    ranked = sorted(range(len(tokens)), key=lambda i: (-scores[i], depth[i], i))[:budget]
    chosen = sorted(ranked)
    index = {old: new for new, old in enumerate(chosen)}
    new_parents = []
    for old in chosen:
        parent = parents[old]
        if parent != ROOT and parent not in index:
            raise ValueError(f"candidate {old} scores above its parent {parent}")
        new_parents.append(ROOT if parent == ROOT else index[parent])
    return [tokens[i] for i in chosen], new_parents, [scores[i] for i in chosen], chosen
