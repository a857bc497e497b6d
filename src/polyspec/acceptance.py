"""Verification of a draft: which draft tokens the verifier keeps, and its own next token.

Pure functions over token ids and probability tensors; no models here, so every rule can be
checked against its closed form.

Greedy: keep draft tokens while they equal the verifier's argmax; then emit the argmax.
Sampling (Leviathan et al. 2023, Chen et al. 2023): keep draft token x drawn from q with
probability min(1, p(x)/q(x)); on the first rejection draw a *recovered* token from
norm(max(0, p - q)); if every draft token is kept, draw a *bonus* token from p. A drafter without
probabilities is a point mass q = 1 on its token. The output is then distributed exactly as p.

Token trees (`polyspec.tree`) walk down from the root, trying the children of the current node
in order against the verifier's distribution p there:
- point masses (distinct tokens chosen without randomness): try x1 with probability p(x1); on
  rejection p <- p without x1, renormalised, and try x2 with p(x2) under that, and so on: child
  i is taken with probability p(xi) exactly, whatever the order;
- children drawn independently from one row q (SpecInfer, SpecTr): take xi with probability
  min(1, p(xi) / q(xi)); on rejection p <- norm(max(0, p - q)) before the next child.
A taken child becomes the current node; when every child is rejected the token is drawn from
the last residual, and at a leaf from p. Both are the chain rule step for step, so one try per
node is the chain rule itself. `node_outcomes` gives the exact outcome probabilities of a node,
which the tests sum into the output distribution.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from polyspec.sampling import sample
from polyspec.tree import ROOT, TokenTree
from polyspec.types import Verdict


def greedy_verdict(draft_tokens: list[int], target_tokens: list[int]) -> Verdict:
    """target_tokens: the verifier's choice at each of the len(draft_tokens) + 1 positions."""
    accepted = 0
    while accepted < len(draft_tokens) and draft_tokens[accepted] == target_tokens[accepted]:
        accepted += 1
    return Verdict(accepted=accepted, token=target_tokens[accepted])


def acceptance_probability(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, token: int) -> float:
    """min(1, p(x) / q(x)) for one position. target_probs, draft_probs: [V]."""
    draft_p = 1.0 if draft_probs is None else float(draft_probs[token])
    return min(1.0, float(target_probs[token]) / draft_p)


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, token: int) -> torch.Tensor:
    """norm(max(0, p - q)), [V]: where the recovered token is drawn after rejecting `token`."""
    if draft_probs is None:
        residual = target_probs.clone()
        residual[token] = 0.0
    else:
        residual = (target_probs - draft_probs).clamp_min_(0.0)
    total = residual.sum()
    # Zero mass means p <= q everywhere, i.e. p == q: a rejection then has probability 0, and
    # only rounding can get here. Falling back to p keeps the draw well defined.
    return residual / total if total > 0 else target_probs


def rejection_verdict(
    draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """draft_probs: [k, V] or None (point masses); target_probs: [k + 1, V] processed exactly as
    plain sampling would process them."""
    k = len(draft_tokens)
    accepted = k
    if k:
        index = torch.tensor(draft_tokens, device=target_probs.device)
        rows = torch.arange(k, device=target_probs.device)
        target_p = target_probs[rows, index]
        draft_p = draft_probs[rows, index] if draft_probs is not None else torch.ones_like(target_p)
        uniform = torch.rand(k, generator=generator, device=target_probs.device)
        rejected = (uniform * draft_p >= target_p).nonzero()
        if len(rejected):
            accepted = int(rejected[0, 0])
    if accepted < k:
        row_draft = None if draft_probs is None else draft_probs[accepted]
        residual = residual_distribution(target_probs[accepted], row_draft, draft_tokens[accepted])
        return Verdict(accepted=accepted, token=sample(residual, generator))
    return Verdict(accepted=k, token=sample(target_probs[k], generator))


def greedy_tree_verdict(tree: TokenTree, target_tokens: list[int]) -> Verdict:
    """target_tokens[0]: the verifier's choice after the context; target_tokens[i + 1]: its
    choice after node i. Follows the child holding the verifier's choice while there is one."""
    node, path = ROOT, []
    while True:
        choice = target_tokens[node + 1]
        node = next((child for child in tree.children(node) if tree.tokens[child] == choice), None)
        if node is None:
            return Verdict(accepted=len(path), token=choice, path=tuple(path))
        path.append(node)


def _draft_row(tree: TokenTree, children: list[int]) -> torch.Tensor | None:
    """The row the children of one node were drawn from (None: point masses)."""
    return None if tree.probs is None else tree.probs[children[0]]


def node_outcomes(
    target_probs: torch.Tensor, child_tokens: list[int], draft_probs: torch.Tensor | None
) -> tuple[list[float], float, torch.Tensor]:
    """Exact outcome of trying these children in order at one node (target_probs, draft_probs:
    [V]): the probability of taking each child, the probability that all are rejected, and the
    distribution the token is then drawn from."""
    residual, reach, taken = target_probs, 1.0, []
    for token in child_tokens:
        accept = acceptance_probability(residual, draft_probs, token)
        taken.append(reach * accept)
        reach *= 1.0 - accept
        residual = residual_distribution(residual, draft_probs, token)
    return taken, reach, residual


def tree_rejection_verdict(
    tree: TokenTree, target_row: Callable[[int], torch.Tensor], generator: torch.Generator | None
) -> Verdict:
    """target_row(0): the verifier's distribution [V] after the context, target_row(i + 1) after
    node i, each processed as plain sampling would process it after that node's own path. Rows
    are asked for only along the walk (one more per kept node), so the others need never be
    processed."""
    node, path = ROOT, []
    while True:
        children = tree.children(node)
        residual = target_row(node + 1)
        device = residual.device
        draft_row = _draft_row(tree, children) if children else None
        chosen = None
        for child in children:
            token = tree.tokens[child]
            accept = acceptance_probability(residual, draft_row, token)
            if float(torch.rand((), generator=generator, device=device)) < accept:
                chosen = child
                break
            residual = residual_distribution(residual, draft_row, token)
        if chosen is None:
            return Verdict(accepted=len(path), token=sample(residual, generator), path=tuple(path))
        path.append(chosen)
        node = chosen
