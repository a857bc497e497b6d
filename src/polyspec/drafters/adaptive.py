"""Adaptive drafting: each step, which drafter drafts and how far, so that speculation pays.

A draft of n tokens is worth E(n) = 1 + a1 + a1 a2 + ... + a1...an tokens for one verify call
of width n + 1, where ai is the chance that draft position i is kept once the ones before it
were. The drafter that maximises E(n) / (draft time + verify time(n + 1)) drafts, and n = 0 —
plain decoding — wins whenever no draft is expected to pay, so adaptive decoding is never slower
than plain decoding by more than the bookkeeping.

- Verify time by width is measured once on the model and device (`measure_verify_costs`), then
  follows the step times this decoder observes (`StepCosts`).
- ai are running estimates per drafter and depth (a Beta prior, with old evidence decaying).
- Deterministic drafters (point masses: n-gram argmax, prompt lookup) propose every step, chosen
  or not: whatever the verifier emits is distributed as plain decoding, so comparing a shadow
  proposal with the tokens that followed is an unbiased look at its acceptance at no verify cost.
  A proposal is scored once the tokens after it decide it, which may be a few steps later.
- Exactness when the verifier samples: a stochastic draft (tokens drawn from rows q) may only be
  cut by a rule that looks at what came before each token, never at the token itself. Such
  drafters are chosen from past evidence before they draft, and cut sequentially: token i is
  kept when adding it raises the expected rate, which depends on depth and on the peak of row
  i (a function of the tokens before it).

Token trees (`propose_tree`, when the engine verifies trees of up to N nodes): the cheap
deterministic drafters each propose a tree of N nodes, and their trees are merged into one
candidate tree (a token two drafters propose after the same path is one node). A node v is
kept, once its parent was, with chance a(v), estimated per drafter from the depth, v's rank
among its siblings and the drafter's own probability for v (its path score over its parent's),
calibrated by how often such nodes were kept (`NodeAcceptance`). Point-mass siblings are disjoint events (child i is
taken with probability p(xi) exactly, `polyspec.acceptance`), so a tree is worth
E = 1 + sum over nodes of P(v), P(v) the product of a along v's path, and siblings' chances
together are at most 1. The nodes sorted by P (parents first: P never grows down a path) are
pruned to the prefix of n nodes that maximises E(n) / verify time(n + 1); n = 0 is plain
decoding. Every P is first scaled by the share of their promise that past trees kept
(`TreeCalibration`): choosing the nodes whose estimates came out highest promises more than
they keep. Drafters too slow to shadow (a draft model) are chosen from evidence, as for chains,
then their tree joins the merge. A drafter whose trees carry rows while the verifier samples
drafts a chain by the chain rule above; nothing stochastic is ever pruned by looking at it.
When the verifier samples, each branching drafter's own chains (drawn from its rows) are one
more arm, chosen from evidence against the merged tree of point masses. And where such a
drafter can draw trees (`propose_sampled_tree`), a bandit (`polyspec.drafters.bandit`) picks each
sampled step's policy by the rates steps measured: the router's choice as above, or a fixed tree
of 2 or 4 independent draws of the first token, each followed by one draw per level.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from polyspec.drafters.bandit import PolicyBandit
from polyspec.drafters.base import Drafter, can_branch, can_draw
from polyspec.tree import EMPTY_TREE, ROOT, TokenTree, select_by_score
from polyspec.types import EMPTY_DRAFT, Draft


@dataclass(frozen=True)
class VerifyCosts:
    """Seconds of one verifier forward by width (tokens fed after a cached context)."""

    widths: tuple[int, ...]
    seconds: tuple[float, ...]

    def __call__(self, width: int) -> float:
        widths, seconds = self.widths, self.seconds
        if width <= widths[0]:
            return seconds[0]
        for i in range(1, len(widths)):
            if width <= widths[i]:
                w0, w1, s0, s1 = widths[i - 1], widths[i], seconds[i - 1], seconds[i]
                return s0 + (s1 - s0) * (width - w0) / (w1 - w0)
        slope = (seconds[-1] - seconds[-2]) / (widths[-1] - widths[-2]) if len(widths) > 1 else 0.0
        return seconds[-1] + slope * (width - widths[-1])

    def to_dict(self) -> dict:
        return {"widths": list(self.widths), "seconds": list(self.seconds)}

    @classmethod
    def from_dict(cls, data: dict) -> VerifyCosts:
        return cls(tuple(int(w) for w in data["widths"]), tuple(float(s) for s in data["seconds"]))


def measure_verify_costs(
    model: torch.nn.Module,
    widths: Sequence[int] = (1, 2, 4, 8, 16, 32),
    context: int = 200,
    repeats: int = 5,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[VerifyCosts, bool]:
    """Median time of a forward of each width after `context` cached tokens (random ids), and
    whether the machine was steady while it ran. Widths take turns within each round, so a burst
    of other work slows them alike; a wider forward never costs less than a narrower one. Steady:
    every width's middle repeats within a quarter of their median (a curve measured on a busy
    machine is worth using for this run, not worth keeping)."""
    from polyspec.cached_lm import CachedLM
    from polyspec.models import synchronizer

    widths = sorted(set(widths))
    lm = CachedLM(model)
    sync = synchronizer(lm.device)
    vocab = model.get_output_embeddings().weight.shape[0]
    rng = random.Random(0)
    lm.reset()
    lm.forward([rng.randrange(vocab) for _ in range(context)], num_logits=1)
    times: dict[int, list[float]] = {width: [] for width in widths}
    for round_ in range(repeats + 1):  # round 0 warms every width up
        for width in widths:
            tokens = [rng.randrange(vocab) for _ in range(width)]
            sync()
            began = clock()
            lm.forward(tokens)
            sync()
            if round_:
                times[width].append(clock() - began)
            lm.rollback(context)
    seconds, steady = [], True
    for width in widths:
        ordered = sorted(times[width])
        median = ordered[len(ordered) // 2]
        middle = ordered[len(ordered) // 4 : len(ordered) - len(ordered) // 4] or ordered
        steady = steady and max(middle) - min(middle) <= 0.25 * median
        seconds.append(max(median, seconds[-1]) if seconds else median)
    return VerifyCosts(tuple(widths), tuple(seconds)), steady


class DepthAcceptance:
    """P(draft position d is kept | positions before it were), per depth, from decaying counts
    with a prior worth two observations; a confidence bucket (row peak) refines it where rows
    exist. Depth 1's prior is the one given (1/2 unless told), depth d's is the estimate at
    depth d - 1: a position is judged only once the ones before it were kept, so a drafter
    whose drafts were cut short would otherwise never learn that longer ones pay."""

    BUCKETS = 4

    def __init__(self, max_depth: int, decay: float = 0.995) -> None:
        self.decay = decay
        size = (max_depth + 1, self.BUCKETS + 1)  # the last bucket: no confidence known
        self.hits = [[0.0] * size[1] for _ in range(size[0])]
        self.trials = [[0.0] * size[1] for _ in range(size[0])]

    def bucket(self, confidence: float | None) -> int:
        return self.BUCKETS if confidence is None else min(int(confidence * self.BUCKETS), self.BUCKETS - 1)

    def rate(self, depth: int, confidence: float | None = None, prior: float = 0.5) -> float:
        b = self.bucket(confidence)
        for d in range(1, min(depth, len(self.hits) - 1) + 1):
            prior = (self.hits[d][b] + 2.0 * prior) / (self.trials[d][b] + 2.0)
        return prior

    def update(self, depth: int, confidence: float | None, kept: bool) -> None:
        """Counts in the confidence's bucket and in the no-confidence one, which then holds the
        rate by depth alone (what a choice made before drafting can use)."""
        depth = min(depth, len(self.hits) - 1)
        for b in {self.bucket(confidence), self.BUCKETS}:
            self.hits[depth][b] = self.hits[depth][b] * self.decay + kept
            self.trials[depth][b] = self.trials[depth][b] * self.decay + 1.0


class NodeAcceptance:
    """P(a tree node is kept | its parent was), by depth, by the node's rank among its siblings
    in the drafter's tree (its first choice, second, later: a drafter's first choice can be
    right far more often than its probability says, as a context match is) and by the drafter's
    own probability for it, from decaying counts. A cell's prior, worth PRIOR_WEIGHT
    observations, is that probability (nodes without one: 1/2) times the rank's calibration:
    kept nodes over the probabilities they were given, pooled over depths and probabilities.
    Most cells see little evidence (deep nodes are judged only after their parents were kept),
    and a corpus n-gram's probabilities can promise far more than a sampling verifier keeps."""

    BUCKETS = 8
    RANKS = 3
    PRIOR_WEIGHT = 2.0

    def __init__(self, max_depth: int, decay: float = 0.995) -> None:
        self.decay = decay
        size = (max_depth + 1) * self.RANKS * (self.BUCKETS + 1)
        self.hits = [0.0] * size
        self.trials = [0.0] * size
        self.max_depth = max_depth
        self.kept = [0.0] * self.RANKS  # per rank: decayed nodes kept ...
        self.promised = [0.0] * self.RANKS  # ... and the sum of their probabilities

    def _cell(self, depth: int, probability: float | None, rank: int) -> int:
        depth, rank = min(depth, self.max_depth), min(rank, self.RANKS - 1)
        b = self.BUCKETS if probability is None else min(max(int(probability * self.BUCKETS), 0), self.BUCKETS - 1)
        return (depth * self.RANKS + rank) * (self.BUCKETS + 1) + b

    def calibration(self, rank: int) -> float:
        """How many times its probability a node of this rank is kept (1 before evidence)."""
        rank = min(rank, self.RANKS - 1)
        return (self.kept[rank] + self.PRIOR_WEIGHT) / (self.promised[rank] + self.PRIOR_WEIGHT)

    def rate(self, depth: int, probability: float | None, rank: int = 0) -> float:
        cell = self._cell(depth, probability, rank)
        prior = min(_probability(probability) * self.calibration(rank), 1.0)
        return (self.hits[cell] + self.PRIOR_WEIGHT * prior) / (self.trials[cell] + self.PRIOR_WEIGHT)

    def update(self, depth: int, probability: float | None, kept: bool, rank: int = 0) -> None:
        cell = self._cell(depth, probability, rank)
        self.hits[cell] = self.hits[cell] * self.decay + kept
        self.trials[cell] = self.trials[cell] * self.decay + 1.0
        rank = min(rank, self.RANKS - 1)
        self.kept[rank] = self.kept[rank] * self.decay + kept
        self.promised[rank] = self.promised[rank] * self.decay + _probability(probability)


def _probability(probability: float | None) -> float:
    return 0.5 if probability is None else min(max(probability, 0.0), 1.0)


# A drafter not tried for this many steps gets one draft, as long as a verify call takes for
# about the cost of one token (`_explore_length`): it may pay again by now, and deeper positions
# are judged only when the ones before them are drafted.
EXPLORE_EVERY = 16
FREE_WIDTH_SHARE = 1.05
# How much better than plain decoding a draft's expected rate must be to be sent.
PLAIN_MARGIN = 1.02
# Drafters cheaper than this share of a verify call propose every step (shadows).
SHADOW_COST_SHARE = 0.1
# Sampled tree mode: fixed shapes of independent draws (draws of the first token, then one per
# level) that a bandit weighs against the router's own choices by their measured rates.
ROUTER_POLICY = "router"
DRAWN_POLICIES = {"2 draws": (2, 1, 1), "4 draws": (4, 1, 1)}


@dataclass
class _Pending:
    """A proposal waiting for the tokens that followed it (a chain is a tree whose node i has
    parent i - 1). marks: per node, the confidence the chain estimates bucket by (row peaks);
    probabilities: per node, the drafter's own probability for it (None: no node evidence)."""

    start: int
    tree: TokenTree
    marks: list[float | None]
    probabilities: list[float | None] | None = None


class _ChainOf:
    """A branching drafter's chains, as a drafter that cannot branch: an arm of its own in tree
    mode when the verifier samples. Its chain is then drawn from rows, and a stochastic draft
    is kept with chance sum(min(p, q)), which can beat any tree of point masses (whose node x
    is kept with chance p(x)) when q spreads over many tokens the verifier likes."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter

    def start(self, prompt_ids, processor, generator) -> None:
        pass  # the drafter itself is started as its own arm

    def propose(self, context: Sequence[int], k: int) -> Draft:
        return self.drafter.propose(context, k)


class _Arm:
    """One drafter with what is known of it; `of`: the arm whose drafter's chains this arm
    drafts (`_ChainOf`)."""

    def __init__(
        self, name: str, drafter: Drafter, max_depth: int, clock: Callable[[], float], of: _Arm | None = None
    ) -> None:
        self.name = name
        self.clock = clock
        self.drafter = drafter
        self.of = of
        self.branches = can_branch(drafter)
        # Greedy and sampled decoding keep drafts at different rates (a greedy verifier's loops
        # are easy to guess, its samples are not): one pair of estimates for each.
        self._estimates = {greedy: (DepthAcceptance(max_depth), NodeAcceptance(max_depth)) for greedy in (True, False)}
        self.use_estimates(greedy=True)
        self.seconds_per_token = 0.0  # decaying mean of a proposal's time per token asked for
        self.calls = 0
        self.tree_seconds = 0.0  # decaying mean of a tree proposal's time
        self.tree_calls = 0
        self.last_chosen = 0
        self.pending: list[_Pending] = []
        self.stochastic = False  # seen to hand over rows while the verifier samples
        self.stochastic_trees = False  # the same, for its trees

    @property
    def chain_view(self) -> bool:
        return self.of is not None

    def use_estimates(self, greedy: bool) -> None:
        """`acceptance`: by depth along its first-choice chain; `nodes`: tree nodes, by depth
        and own probability."""
        self.acceptance, self.nodes = self._estimates[greedy]

    def rate(self, depth: int, confidence: float | None = None) -> float:
        """Chance that draft position `depth` is kept. A chain arm's prior is how often its
        drafter's first choices were kept (shadowed every step, so known long before the chain
        arm has evidence of its own): a drawn token is kept about as often where rows are peaked,
        and a sampling verifier keeps few of a corpus n-gram's guesses."""
        prior = 0.5 if self.of is None else self.of.acceptance.rate(depth)
        return self.acceptance.rate(depth, confidence, prior)

    def shadowed(self, verify_seconds: float, greedy: bool) -> bool:
        """Deterministic and cheap: it may propose every step, chosen or not."""
        cheap = self.seconds_per_token * 4 < SHADOW_COST_SHARE * verify_seconds
        return cheap and not (self.stochastic and not greedy)

    def shadowed_tree(self, verify_seconds: float, greedy: bool) -> bool:
        cheap = self.tree_seconds < SHADOW_COST_SHARE * verify_seconds
        return cheap and not (self.stochastic_trees and not greedy)

    def timed_propose(self, context: Sequence[int], k: int) -> Draft:
        began = self.clock()
        draft = self.drafter.propose(context, k)
        spent = self.clock() - began
        self.calls += 1
        self.seconds_per_token += (spent / max(k, 1) - self.seconds_per_token) / min(self.calls, 20)
        return draft

    def timed_tree(self, context: Sequence[int], budget: int, depth: int) -> TokenTree:
        """Its tree (a drafter that cannot branch: its chain)."""
        began = self.clock()
        if self.branches:
            tree = self.drafter.propose_tree(context, budget, depth)
        else:
            draft = self.drafter.propose(context, min(budget, depth))
            tree = TokenTree.chain(draft.tokens, draft.probs)
        spent = self.clock() - began
        self.tree_calls += 1
        self.tree_seconds += (spent - self.tree_seconds) / min(self.tree_calls, 20)
        return tree

    def settle(self, context: Sequence[int]) -> None:
        """Score the pending proposals that the tokens after them now decide."""
        self.pending = [pending for pending in self.pending if not self._settled(pending, context)]

    def _settled(self, pending: _Pending, context: Sequence[int]) -> bool:
        tree, start = pending.tree, pending.start
        known = len(context) - start
        walk: list[int] = []  # the node kept at each depth
        node = ROOT
        while children := tree.children(node):
            if len(walk) >= known:
                return False  # still matching where the tokens end: wait for more
            token = context[start + len(walk)]
            node = next((child for child in children if tree.tokens[child] == token), None)
            if node is None:
                break
            walk.append(node)
        if pending.probabilities is not None:
            parent = ROOT
            for depth in range(1, len(walk) + 2):
                kept = walk[depth - 1] if depth <= len(walk) else None
                for rank, child in enumerate(tree.children(parent)):
                    self.nodes.update(depth, pending.probabilities[child], child == kept, rank)
                if kept is None:
                    break
                parent = kept
        node, depth = ROOT, 1
        while children := tree.children(node):  # the first choices make the chain estimates
            kept = depth <= len(walk) and walk[depth - 1] == children[0]
            self.acceptance.update(depth, pending.marks[children[0]], kept)
            if not kept:
                break
            node, depth = children[0], depth + 1
        return True


def node_probabilities(tree: TokenTree) -> list[float | None]:
    """Each node's probability given its parent, by the drafter's own path scores (None: none)."""
    scores = tree.scores
    if len(scores) != len(tree):
        return [None] * len(tree)
    out: list[float | None] = []
    for score, parent in zip(scores, tree.parents, strict=True):
        above = 1.0 if parent == ROOT else scores[parent]
        out.append(min(score / above, 1.0) if above > 0 else None)
    return out


def confidences(draft: Draft) -> list[float | None]:
    """Row peaks of a stochastic draft (each a function of the tokens before it), else None."""
    if draft.probs is None:
        return [None] * len(draft)
    return [float(p) for p in draft.probs.max(dim=-1).values.tolist()]


@dataclass
class Candidates:
    """Trees merged into one: node i follows parents[i] (ROOT: the context), `path` is its
    estimated chance of being kept (the product of the node chances along its path), `owners`
    the drafters that proposed it."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    path: list[float]
    owners: list[set[str]]

    def ranked(self, budget: int) -> list[int]:
        """The `budget` most probable nodes, best first; ties: shallower. Every prefix holds
        the parents of its nodes."""
        order = sorted(range(len(self.tokens)), key=lambda i: (-self.path[i], self.depths[i], i))
        return order[:budget]


def merge(proposals: Sequence[tuple[_Arm, TokenTree, list[float | None]]]) -> Candidates:
    """One candidate tree from every drafter's tree; a node's chance is the highest any of its
    drafters gives it, and siblings' chances are scaled to sum to at most 1."""
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    chance: list[float] = []
    owners: list[set[str]] = []
    index: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for arm, tree, probabilities in proposals:
        mapped: list[int] = []
        siblings: Counter[int] = Counter()  # children of each of this tree's nodes so far
        for i, (token, parent) in enumerate(zip(tree.tokens, tree.parents, strict=True)):
            above = ROOT if parent == ROOT else mapped[parent]
            depth = 1 if above == ROOT else depths[above] + 1
            estimate = arm.nodes.rate(depth, probabilities[i], siblings[parent])
            siblings[parent] += 1
            node = index.get((above, token))
            if node is None:
                node = index[(above, token)] = len(tokens)
                tokens.append(token)
                parents.append(above)
                depths.append(depth)
                chance.append(estimate)
                owners.append({arm.name})
            else:
                chance[node] = max(chance[node], estimate)
                owners[node].add(arm.name)
            mapped.append(node)
    totals: dict[int, float] = {}
    for node, above in enumerate(parents):
        totals[above] = totals.get(above, 0.0) + chance[node]
    path: list[float] = []
    for node, above in enumerate(parents):
        share = chance[node] / max(totals[above], 1.0)
        path.append(share * (1.0 if above == ROOT else path[above]))
    return Candidates(tokens, parents, depths, path, owners)


class TreeCalibration:
    """How many of the tokens its node estimates promise a merged tree of point masses keeps,
    from decaying sums (a prior worth PRIOR_WEIGHT promised tokens says all). The node
    estimates are each fair, but the tree keeps the nodes whose estimates came out highest,
    and a node several drafters propose takes the highest of theirs: both promise more than
    is kept, and this scale takes the difference out of every node's path chance."""

    PRIOR_WEIGHT = 2.0

    def __init__(self, decay: float = 0.99) -> None:
        self.decay = decay
        self.kept = 0.0
        self.promised = 0.0

    @property
    def scale(self) -> float:
        return min((self.kept + self.PRIOR_WEIGHT) / (self.promised + self.PRIOR_WEIGHT), 1.0)

    def update(self, promised: float, kept: int) -> None:
        self.kept = self.kept * self.decay + kept
        self.promised = self.promised * self.decay + promised


class StepCosts:
    """Seconds of a whole verify step by width, as this decoder sees them: the observed time
    between two proposals where a width was seen often enough, else the measured forward curve
    fitted to the observations as a * forward(width) + b * width. The second term is what the
    forward curve leaves out: judging every row (a sampled row is a top-k over the vocabulary)
    and the tree's bookkeeping, which grow with the width even where the forward does not."""

    def __init__(self, forward: VerifyCosts, decay: float = 0.9) -> None:
        self.forward = forward
        self.decay = decay
        self.observed: dict[int, tuple[float, float]] = {}  # width -> (decayed sum, decayed count)
        self._fit = (1.0, 0.0)

    def record(self, width: int, seconds: float) -> None:
        total, count = self.observed.get(width, (0.0, 0.0))
        self.observed[width] = (total * self.decay + seconds, count * self.decay + 1.0)
        self._fit = self._refit()

    def _refit(self) -> tuple[float, float]:
        """(a, b >= 0) by least squares over the observed widths, weighted by their counts."""
        rows = [
            (count, self.forward(width), float(width), total / count) for width, (total, count) in self.observed.items()
        ]
        ff = sum(c * f * f for c, f, _, _ in rows)
        ft = sum(c * f * t for c, f, _, t in rows)
        if len(rows) >= 2:
            fw = sum(c * f * w for c, f, w, _ in rows)
            ww = sum(c * w * w for c, _, w, _ in rows)
            wt = sum(c * w * t for c, _, w, t in rows)
            det = ff * ww - fw * fw
            if det > 1e-12 * ff * ww:
                a, b = (ft * ww - fw * wt) / det, (ff * wt - fw * ft) / det
                if a > 0 and b >= 0:
                    return a, b
        return ft / ff, 0.0  # one width seen, or a fit that says wider is cheaper: scale only

    def __call__(self, width: int) -> float:
        total, count = self.observed.get(width, (0.0, 0.0))
        if count >= 3:
            return total / count
        a, b = self._fit
        return a * self.forward(width) + b * width


def within_budget(widths: Sequence[int], budget: int) -> tuple[int, ...]:
    """The levels of a drawn tree (widths[d] draws under every node at depth d) that fit in
    `budget` nodes, the first level narrowed if even it does not."""
    kept, nodes, level = [], 0, 1
    for width in widths:
        level *= width
        if nodes + level > budget:
            break
        kept.append(width)
        nodes += level
    if not kept and widths and budget > 0:
        kept = [min(widths[0], budget)]
    return tuple(kept)


class AdaptiveDrafter:
    """Routes among drafters and sizes each draft (a chain, or a token tree when the engine
    verifies trees) by the expected tokens per second."""

    def __init__(
        self,
        drafters: dict[str, Drafter],
        costs: VerifyCosts,
        max_depth: int = 8,
        observe_costs: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.observe_costs = observe_costs  # off: trust the measured curve alone (reproducible choices)
        self.clock = clock  # what drafting and steps are timed by
        self.arms = [_Arm(name, drafter, max_depth, clock) for name, drafter in drafters.items()]
        self.arms += [
            _Arm(f"{arm.name} chain", _ChainOf(arm.drafter), max_depth, clock, of=arm)
            for arm in list(self.arms)
            if arm.branches
        ]
        # Judging a sampled row costs more than a greedy one: step times are kept per mode.
        self._step_costs = {greedy: StepCosts(costs) for greedy in (True, False)}
        self.costs = self._step_costs[True]
        self._calibrations = {greedy: TreeCalibration() for greedy in (True, False)}
        self.calibration = self._calibrations[True]
        self.max_depth = max_depth
        # Proposals by the drafters that made them ("" = plain steps; a merged tree: "a | b").
        self.route: Counter[str] = Counter()
        self.widths: Counter[int] = Counter()  # tree mode: nodes sent per step
        self._greedy = True
        self._steps = 0
        self._sent: tuple[int, float] | None = None  # width of the last step and when it began
        self._promised: tuple[int, float] | None = None  # a merged tree's context length and promise
        drawing = [arm for arm in self.arms if arm.of is not None and can_draw(arm.of.drafter)]
        self._drawing = drawing  # chain arms whose drafter can draw trees
        self.policies = PolicyBandit([ROUTER_POLICY, *DRAWN_POLICIES]) if drawing else None
        self._step: tuple[str, int, float] | None = None  # sampled tree step: policy, context length, start

    def start(self, prompt_ids, processor, generator) -> None:
        # Estimates carry over from earlier sequences in the same mode: they describe the drafters
        # on this verifier.
        self._greedy = processor.config.greedy
        self.costs = self._step_costs[self._greedy]
        self.calibration = self._calibrations[self._greedy]
        for arm in self.arms:
            arm.drafter.start(prompt_ids, processor, generator)
            arm.use_estimates(self._greedy)
            arm.pending = []
        self._sent = self._promised = self._step = None

    def _observe(self) -> None:
        if self._sent is not None and self.observe_costs:
            width, began = self._sent
            self.costs.record(width, self.clock() - began)

    def _cut(self, arm: _Arm, marks: Sequence[float | None]) -> tuple[int, float]:
        """(n, expected tokens per second): extend while the rate rises (a sequential rule)."""
        best_n, best = 0, 1.0 / self.costs(1)
        expected, survive = 1.0, 1.0
        for n, confidence in enumerate(marks, start=1):
            survive *= arm.rate(n, confidence)
            expected += survive
            rate = expected / (n * arm.seconds_per_token + self.costs(n + 1))
            if rate <= best:
                break
            best_n, best = n, rate
        return best_n, best

    def _settle(self, context: Sequence[int]) -> None:
        for arm in self.arms:
            arm.settle(context)
        self._steps += 1

    def propose(self, context: Sequence[int], k: int) -> Draft:
        self._observe()
        draft = self._choose(context, k)
        self._sent = (len(draft) + 1, self.clock())
        return draft

    def _choose(self, context: Sequence[int], k: int) -> Draft:
        self._settle(context)
        k = min(k, self.max_depth)
        if k <= 0:
            return EMPTY_DRAFT
        verify = self.costs(1)
        # A draft must beat plain decoding by a margin: a wider step also costs judging its rows.
        best_rate, best_arm, best_draft, best_n = PLAIN_MARGIN / verify, None, None, 0
        exploring = False
        for arm in self.arms:
            if arm.chain_view:
                continue  # chain mode: the drafter itself drafts this chain
            draft = None
            if arm.shadowed(verify, self._greedy):
                draft = arm.timed_propose(context, k)
                if draft.probs is not None and not self._greedy:
                    arm.stochastic = True  # its rows depend on its draws: never cut by looking at them
                    continue
                arm.pending.append(_Pending(len(context), TokenTree.chain(draft.tokens), [None] * len(draft)))
                n, rate = self._cut(arm, [None] * len(draft))
            else:
                n, rate = self._cut(arm, [None] * k)
                if self._steps - arm.last_chosen >= EXPLORE_EVERY:
                    n, rate = self._explore_length(k), math.inf
            if n and rate > best_rate:
                best_rate, best_arm, best_draft, best_n = rate, arm, draft, n
                exploring = rate == math.inf
        if best_arm is None:
            self.route[""] += 1
            return EMPTY_DRAFT
        arm, n = best_arm, best_n
        arm.last_chosen = self._steps
        self.route[arm.name] += 1
        if best_draft is not None:
            return Draft(tokens=best_draft.tokens[:n])
        return self._evidence_chain(arm, context, n, cut=not exploring)

    def _explore_length(self, depth: int) -> int:
        """The longest draft (at most `depth`) whose verify forward costs about one token's."""
        forward = self.costs.forward
        one = forward(1)
        n = 1
        while n < depth and forward(n + 2) <= FREE_WIDTH_SHARE * one:
            n += 1
        return n

    def _evidence_chain(self, arm: _Arm, context: Sequence[int], n: int, cut: bool = True) -> Draft:
        """Chosen from evidence alone: draw n tokens, then (unless exploring) cut by the rows'
        peaks, token by token."""
        draft = arm.timed_propose(context, n)
        marks = confidences(draft)
        n, _ = self._cut(arm, marks) if draft.probs is not None and cut else (len(draft), 0.0)
        arm.pending.append(_Pending(len(context), TokenTree.chain(draft.tokens[:n]), marks[:n]))
        if n == 0:
            return EMPTY_DRAFT
        return Draft(tokens=draft.tokens[:n], probs=None if draft.probs is None else draft.probs[:n])

    # Token trees.

    def propose_tree(self, context: Sequence[int], budget: int, max_depth: int) -> TokenTree:
        """The tree of at most `budget` nodes and `max_depth` levels (EMPTY_TREE: plain
        decoding) of highest expected tokens per second."""
        began = self.clock()
        self._observe()
        if self._promised is not None:
            length, promised = self._promised
            self.calibration.update(promised, len(context) - length - 1)
            self._promised = None
        if self._step is not None:
            policy, length, start = self._step
            self.policies.record(policy, len(context) - length, began - start)
            self._step = None
        if self.policies is None or self._greedy:
            tree = self._choose_tree(context, budget, max_depth)
        else:
            policy = self.policies.choose()
            if policy == ROUTER_POLICY:
                tree = self._choose_tree(context, budget, max_depth)
            else:
                widths = DRAWN_POLICIES[policy][: min(max_depth, self.max_depth)]
                tree = self._drawn_tree(context, within_budget(widths, budget), policy)
            self._step = (policy, len(context), began)
        self._sent = (len(tree) + 1, self.clock())
        self.widths[len(tree)] += 1
        return tree

    def _drawn_tree(self, context: Sequence[int], widths: tuple[int, ...], policy: str) -> TokenTree:
        """A fixed shape of independent draws from the chain arm whose first tokens were kept
        most often (chosen before drawing, from past evidence only)."""
        self._settle(context)
        arm = max(self._drawing, key=lambda arm: arm.rate(1))
        tree = arm.of.drafter.propose_sampled_tree(context, widths)
        if not len(tree):
            return self._plain()
        arm.last_chosen = self._steps
        arm.pending.append(_Pending(len(context), tree, [None] * len(tree)))
        self.route[f"{arm.name}, {policy}"] += 1
        return tree

    def _plain(self) -> TokenTree:
        self.route[""] += 1
        return EMPTY_TREE

    def _choose_tree(self, context: Sequence[int], budget: int, max_depth: int) -> TokenTree:
        self._settle(context)
        depth = min(max_depth, self.max_depth)
        if depth <= 0 or budget <= 0:
            return self._plain()
        verify = self.costs(1)
        costs = [self.costs(width) for width in range(1, budget + 2)]  # costs[n]: a tree of n nodes
        proposals: list[tuple[_Arm, TokenTree, list[float | None]]] = []
        # Greedy trees hold the chains' tokens already: a second copy would only widen calls.
        arms = [arm for arm in self.arms if not (arm.chain_view and self._greedy)]
        shadows = [arm for arm in arms if arm.shadowed_tree(verify, self._greedy)]
        for arm in shadows:
            tree = arm.timed_tree(context, budget, depth)
            if tree.probs is not None and not self._greedy:
                arm.stochastic_trees = True  # its rows depend on its draws: never cut by looking at them
                continue
            proposals.append((arm, tree, self._pend(arm, context, tree)))
        candidates = merge(proposals)
        scale = self.calibration.scale
        chosen, rate = self._prune(candidates, costs, scale)
        best_rate, best_arm = rate if chosen else 0.0, None
        for arm in arms:
            if arm in shadows:
                continue
            estimate = self._evidence_rate(arm, depth, budget, costs)
            if self._steps - arm.last_chosen >= EXPLORE_EVERY:
                estimate = math.inf
            if estimate > best_rate:
                best_rate, best_arm = estimate, arm
        exploring = best_rate == math.inf
        if best_arm is not None and best_rate > PLAIN_MARGIN / verify:
            arm = best_arm
            arm.last_chosen = self._steps
            if arm.stochastic_trees and not self._greedy:
                return self._stochastic_chain(arm, context, depth, exploring)
            tree = arm.timed_tree(context, budget, depth)
            if tree.probs is not None and not self._greedy:
                # Drawn after it was chosen: sent whole, never cut by looking at it.
                arm.stochastic_trees = True
                arm.pending.append(_Pending(len(context), tree, [None] * len(tree), node_probabilities(tree)))
                self.route[arm.name] += 1
                return tree
            proposals.append((arm, tree, self._pend(arm, context, tree)))
            candidates = merge(proposals)  # its drafting time is spent: only verify time counts now
            chosen, rate = self._prune(candidates, costs, scale)
        if not chosen or rate <= PLAIN_MARGIN / verify:
            return self._plain()
        tokens, parents, scores, _ = select_by_score(
            candidates.tokens, candidates.parents, candidates.path, len(chosen)
        )
        self.route[" | ".join(sorted(set().union(*(candidates.owners[i] for i in chosen))))] += 1
        self._promised = (len(context), sum(candidates.path[i] for i in chosen))
        return TokenTree(tokens=tokens, parents=parents, scores=scores)

    @staticmethod
    def _pend(arm: _Arm, context: Sequence[int], tree: TokenTree) -> list[float | None]:
        """Keeps the tree to score against the tokens that follow; returns its node probabilities."""
        probabilities = node_probabilities(tree)
        arm.pending.append(_Pending(len(context), tree, [None] * len(tree), probabilities))
        return probabilities

    @staticmethod
    def _prune(candidates: Candidates, costs: list[float], scale: float = 1.0) -> tuple[list[int], float]:
        """The most probable nodes, as many as maximise expected tokens per verify second (none:
        plain decoding), and that rate; `scale`: the share of their chances that trees keep."""
        ranked = candidates.ranked(len(costs) - 1)
        best_n, best = 0, 1.0 / costs[0]
        expected = 1.0
        for n, node in enumerate(ranked, start=1):
            expected += scale * candidates.path[node]
            rate = expected / costs[n]
            if rate > best:
                best_n, best = n, rate
        return ranked[:best_n], best

    def _evidence_rate(self, arm: _Arm, depth: int, budget: int, costs: list[float]) -> float:
        """Expected tokens per second of an arm that is not shadowed, from its chain estimates
        (a tree can only do better) and its drafting time."""
        if arm.stochastic_trees and not self._greedy:
            n, rate = self._cut(arm, [None] * depth)
            return rate if n else 0.0
        best, expected, survive = 0.0, 1.0, 1.0
        for n in range(1, min(depth, budget) + 1):
            survive *= arm.rate(n)
            expected += survive
            best = max(best, expected / (arm.tree_seconds + costs[n]))
        return best

    def _stochastic_chain(self, arm: _Arm, context: Sequence[int], depth: int, exploring: bool) -> TokenTree:
        """A chain by the chain rule: its length from evidence, then cut by its rows' peaks."""
        n, _ = self._cut(arm, [None] * depth)
        n = self._explore_length(depth) if exploring else n
        if n == 0:
            return self._plain()
        draft = self._evidence_chain(arm, context, n, cut=not exploring)
        if not len(draft):
            return self._plain()
        self.route[arm.name] += 1
        return TokenTree.chain(draft.tokens, draft.probs)
