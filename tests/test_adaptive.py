"""Adaptive drafting stays lossless, drafts nothing when drafts do not pay, and drafts long
when they do; in chains and in token trees."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest
from fixtures import OracleDrafter, check_sampling_is_exact, hf_greedy, random_prompts

from polyspec.decoding import Decoder
from polyspec.drafters import adaptive as adaptive_module
from polyspec.drafters.adaptive import (
    AdaptiveDrafter,
    DepthAcceptance,
    NodeAcceptance,
    StepCosts,
    TreeCalibration,
    VerifyCosts,
    measure_verify_costs,
    merge,
    within_budget,
)
from polyspec.drafters.model import ModelDrafter
from polyspec.drafters.prompt_lookup import PromptLookupDrafter
from polyspec.sampling import SamplingConfig
from polyspec.tree import ROOT, TokenTree
from polyspec.types import Draft

# A CPU in bfloat16: a verify call costs about the same up to 8 tokens, then grows.
FLAT_COSTS = VerifyCosts((1, 2, 4, 8, 16, 32), (1.0, 1.0, 1.0, 1.08, 1.26, 1.65))


class RandomDrafter:
    """Point-mass guesses that are almost never right."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def start(self, prompt_ids, processor, generator) -> None:
        pass

    def propose(self, context, k) -> Draft:
        return Draft(tokens=[self.rng.randrange(4, 64) for _ in range(k)])


class UnknownDrafter:
    """Always guesses <unk>, which the verifier does not write."""

    def start(self, prompt_ids, processor, generator) -> None:
        pass

    def propose(self, context, k) -> Draft:
        return Draft(tokens=[3] * k)


def test_verify_costs_interpolate_and_extrapolate():
    costs = VerifyCosts((1, 4, 8), (1.0, 1.0, 2.0))
    assert costs(1) == 1.0 and costs(2) == 1.0 and costs(6) == 1.5 and costs(8) == 2.0
    assert costs(12) == pytest.approx(3.0)
    assert VerifyCosts.from_dict(costs.to_dict()) == costs


def test_depth_acceptance_follows_the_evidence():
    estimate = DepthAcceptance(max_depth=4)
    assert estimate.rate(1) == 0.5
    for _ in range(200):
        estimate.update(1, None, True)
        estimate.update(2, 0.9, False)
    assert estimate.rate(1) > 0.9
    assert estimate.rate(2, 0.9) < 0.1 and estimate.rate(2) < 0.1  # the depth-only rate sees it too
    assert estimate.rate(2, 0.1) == 0.5  # another confidence bucket has no evidence


def test_a_deeper_position_starts_from_the_evidence_of_the_one_before_it():
    # Drafts cut after one token never show depth 2 to the verifier: its estimate must not
    # stay at the prior while depth 1 proves the drafter right.
    estimate = DepthAcceptance(max_depth=4)
    for _ in range(200):
        estimate.update(1, None, True)
    assert estimate.rate(2) > 0.9 and estimate.rate(4) > 0.9
    for _ in range(200):
        estimate.update(2, None, False)
    assert estimate.rate(2) < 0.05 and estimate.rate(3) < 0.1  # depth 2's own evidence wins
    assert estimate.rate(1) > 0.95


def test_tree_calibration_keeps_the_share_of_the_promise_that_was_kept():
    calibration = TreeCalibration()
    assert calibration.scale == 1.0
    for _ in range(300):
        calibration.update(promised=1.0, kept=0)
        calibration.update(promised=1.0, kept=1)
    assert calibration.scale == pytest.approx(0.5, abs=0.02)
    for _ in range(300):
        calibration.update(promised=0.5, kept=2)
    assert calibration.scale == 1.0  # trees that keep more than promised are not scaled up


def test_a_tree_that_keeps_nothing_scales_its_promise_down(verifier):
    adaptive = AdaptiveDrafter({"junk": JunkTrees()}, FLAT_COSTS, observe_costs=False)
    decoder = Decoder(verifier)
    for prompt in random_prompts(4, seed=2):
        decoder.generate(prompt, adaptive, gamma=4, tree=16, max_new_tokens=30)
    calibration = adaptive.calibration
    assert calibration.promised > 1.0 and calibration.kept == 0.0  # <unk> and <pad> are never written
    assert calibration.scale < 0.7


def test_step_costs_learn_what_each_row_adds_to_a_flat_forward():
    steps = StepCosts(FLAT_COSTS)
    assert steps(1) == 1.0 and steps(16) == 1.26  # nothing observed: the forward curve
    for width in (5, 9, 13, 17) * 2:  # each row judged costs 0.05 on top of the forward
        steps.record(width, 2.0 * FLAT_COSTS(width) + 0.05 * width)
    assert steps(1) == pytest.approx(2.0 + 0.05)  # plain decoding, never seen, is not scaled up with them
    assert steps(33) == pytest.approx(2.0 * FLAT_COSTS(33) + 0.05 * 33)
    for _ in range(60):  # a width seen often: its own decayed mean
        steps.record(9, 3.0)
    assert steps(9) == pytest.approx(3.0, rel=1e-3)


def test_step_costs_of_one_width_scale_the_curve():
    steps = StepCosts(FLAT_COSTS)
    steps.record(8, 2.16)
    assert steps(1) == pytest.approx(2.0) and steps(16) == pytest.approx(2.52)


def test_measured_costs_are_sorted_positive_and_never_fall_with_width(verifier):
    costs, steady = measure_verify_costs(verifier.model, widths=(1, 4, 2), context=16, repeats=2)
    assert costs.widths == (1, 2, 4) and costs.seconds[0] > 0
    assert list(costs.seconds) == sorted(costs.seconds)  # a wider forward never reads cheaper


class FakeClock:
    """A clock for measure_verify_costs and the router: each reading advances by the next step,
    so each timed forward lasts one step."""

    def __init__(self, steps) -> None:
        self.now, self.steps = 0.0, iter(steps)

    def __call__(self) -> float:
        self.now += next(self.steps)
        return self.now


@pytest.mark.parametrize("jitter, steady", [(0.0, True), (3.0, False)])
def test_a_curve_is_steady_only_when_its_rounds_agree(verifier, jitter, steady):
    rng = random.Random(0)
    clock = FakeClock(1.0 + jitter * rng.random() for _ in range(10_000))
    costs, measured_steady = measure_verify_costs(verifier.model, widths=(1, 2), context=8, repeats=5, clock=clock)
    assert measured_steady is steady
    assert jitter or costs.seconds == (1.0, 1.0)


def test_only_a_steady_curve_is_kept_for_the_next_run(verifier, monkeypatch, tmp_path):
    import polyspec.drafters.adaptive as adaptive
    from polyspec.specs import verify_costs

    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path))
    measured = []

    def fake_measure(model, steady):
        measured.append(steady)
        return VerifyCosts((1, 2), (1.0, 1.5)), steady

    monkeypatch.setattr(adaptive, "measure_verify_costs", lambda model: fake_measure(model, False))
    assert verify_costs(verifier).seconds == (1.0, 1.5)
    assert not list(tmp_path.glob("verify-costs/*.json"))  # a busy machine's curve is not kept
    monkeypatch.setattr(adaptive, "measure_verify_costs", lambda model: fake_measure(model, True))
    verify_costs(verifier)
    assert len(list(tmp_path.glob("verify-costs/*.json"))) == 1
    assert verify_costs(verifier).seconds == (1.0, 1.5) and measured == [False, True]  # read, not measured


@pytest.mark.parametrize("gamma", [2, 6])
def test_greedy_identity_with_transformers(verifier, draft_dir, gamma):
    from polyspec.models import LoadedModel

    draft = LoadedModel.load(str(draft_dir), dtype="float32")
    adaptive = AdaptiveDrafter(
        {"lookup": PromptLookupDrafter(), "random": RandomDrafter(), "model": ModelDrafter(draft, verifier.vocab_size)},
        FLAT_COSTS,
    )
    decoder = Decoder(verifier)
    for prompt in random_prompts(6, seed=gamma):
        result = decoder.generate(prompt, adaptive, gamma=gamma, max_new_tokens=30)
        assert result.token_ids == hf_greedy(verifier.model, prompt, 30)


def test_a_drafter_that_never_pays_ends_in_plain_decoding(verifier):
    # Measured costs only: observed step times on a shared machine would make this a coin toss.
    costs = VerifyCosts((1, 2, 4, 8), (1.0, 1.03, 1.05, 1.1))
    adaptive = AdaptiveDrafter({"unk": UnknownDrafter()}, costs, observe_costs=False)
    decoder = Decoder(verifier)
    for i, prompt in enumerate(random_prompts(8, seed=1)):
        if i == 4:
            adaptive.route.clear()  # what it does once it has learnt is what counts
        decoder.generate(prompt, adaptive, gamma=4, max_new_tokens=40)
    assert adaptive.route[""] > 0.9 * sum(adaptive.route.values())


def test_a_drafter_that_is_always_right_drafts_long(verifier):
    prompt = [2, 9, 13, 5]
    oracle = OracleDrafter(prompt, hf_greedy(verifier.model, prompt, 80))
    # The curve alone prices a step: observed step times on a shared machine would decide otherwise.
    adaptive = AdaptiveDrafter({"oracle": oracle, "random": RandomDrafter()}, FLAT_COSTS, observe_costs=False)
    result = Decoder(verifier).generate(prompt, adaptive, gamma=8, max_new_tokens=80)
    assert result.stats.tokens_per_call > 4
    assert adaptive.route["oracle"] > 5 * adaptive.route["random"]


def test_greedy_evidence_does_not_make_sampled_drafts(verifier):
    # Right whenever the verifier is greedy, a random guess once it samples.
    prompt = [2, 9, 13, 5]
    oracle = OracleDrafter(prompt, hf_greedy(verifier.model, prompt, 40))
    steep = VerifyCosts((1, 2, 4, 8), (1.0, 1.5, 2.5, 4.5))  # each drafted token costs half a step
    adaptive = AdaptiveDrafter({"oracle": oracle}, steep, observe_costs=False)
    decoder = Decoder(verifier)
    greedy, sampled = Counter(), Counter()
    for seed in range(6):
        before = Counter(adaptive.route)
        decoder.generate(prompt, adaptive, gamma=4, max_new_tokens=40)
        between = Counter(adaptive.route)
        sampling = SamplingConfig(temperature=1.0)
        decoder.generate(prompt, adaptive, gamma=4, max_new_tokens=40, sampling=sampling, seed=seed)
        if seed >= 2:  # once both modes have evidence
            greedy += between - before
            sampled += Counter(adaptive.route) - between
    assert greedy["oracle"] > 0.9 * sum(greedy.values())
    assert sampled[""] > 0.8 * sum(sampled.values())


class CostlyDrafter:
    """A drafter whose every token costs one plain step on the router's clock: the time it is
    measured by is the test's, not a machine's that other work may slow."""

    def __init__(self, drafter, clock: FakeClock) -> None:
        self.drafter, self.clock = drafter, clock

    def start(self, prompt_ids, processor, generator) -> None:
        self.drafter.start(prompt_ids, processor, generator)

    def propose(self, context, k):
        self.clock.now += k * FLAT_COSTS(1)
        return self.drafter.propose(context, k)


def test_a_costly_drafter_that_is_right_only_as_often_as_it_costs_is_not_used(verifier):
    # The verifier as its own drafter is always right, but each token costs a full step.
    clock = FakeClock(itertools.repeat(0.0))
    drafter = CostlyDrafter(ModelDrafter(verifier, verifier.vocab_size), clock)
    adaptive = AdaptiveDrafter({"self": drafter}, FLAT_COSTS, observe_costs=False, clock=clock)
    decoder = Decoder(verifier)
    for prompt in random_prompts(3, seed=2):
        decoder.generate(prompt, adaptive, gamma=4, max_new_tokens=40)
    assert adaptive.route[""] > 0.8 * sum(adaptive.route.values())


@pytest.mark.slow
def test_sampled_output_follows_the_exact_distribution(verifier, draft_dir):
    from polyspec.models import LoadedModel

    draft = LoadedModel.load(str(draft_dir), dtype="float32")
    adaptive = AdaptiveDrafter(
        {"lookup": PromptLookupDrafter(), "model": ModelDrafter(draft, verifier.vocab_size)},
        FLAT_COSTS,
        observe_costs=False,  # drafts must be sent whatever the step times of a busy machine
    )
    check_sampling_is_exact(verifier, adaptive, trials=800)


def test_generate_cli_with_adaptive_drafting_is_lossless(verifier, verifier_dir, monkeypatch, tmp_path):
    import json

    from fixtures import run_cli

    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path))
    measure = adaptive_module.measure_verify_costs  # the real curve, called steady: a busy machine keeps none
    monkeypatch.setattr(adaptive_module, "measure_verify_costs", lambda model: (measure(model)[0], True))
    prompt = "w5 w6 w7 w5 w6 w7 w5"
    args = ["generate", "--verifier", str(verifier_dir), "--dtype", "float32", "--prompt", prompt, "--json"]
    code, out, err = run_cli(*args, "--drafter", "adaptive:prompt-lookup;prompt-lookup:2-4",
                             "--gamma", "6", "--max-new-tokens", "30")  # fmt: skip
    assert code == 0, err
    ids = verifier.tokenizer(prompt)["input_ids"]
    assert json.loads(out)["token_ids"] == hf_greedy(verifier.model, ids, 30)
    assert list((tmp_path / "verify-costs").glob("*.json"))  # measured once, kept for the next run
    code, _, err = run_cli(*args, "--drafter", "adaptive:oops")
    assert code == 2 and "unknown drafter" in err and "Traceback" not in err


# Token trees.


class Recording(AdaptiveDrafter):
    """Keeps every tree it sends."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[TokenTree] = []

    def propose_tree(self, context, budget, max_depth):
        tree = super().propose_tree(context, budget, max_depth)
        assert len(tree) <= budget and tree.depth <= max_depth
        self.sent.append(tree)
        return tree


class JunkTrees:
    """Trees of tokens the verifier does not write (<unk>, <pad>), as many nodes as asked for."""

    def start(self, prompt_ids, processor, generator) -> None:
        pass

    def propose(self, context, k) -> Draft:
        return Draft(tokens=[3] * k)

    def propose_tree(self, context, budget, max_depth) -> TokenTree:
        tokens, parents, frontier = [], [], [ROOT]
        while frontier and len(tokens) < budget:
            node = frontier.pop(0)
            for token in (3, 0):
                if len(tokens) < budget and (node == ROOT or len(TokenTree(tokens, parents).path(node)) < max_depth):
                    tokens.append(token)
                    parents.append(node)
                    frontier.append(len(tokens) - 1)
        return TokenTree(tokens=tokens, parents=parents, scores=[0.5 ** len(TokenTree(tokens, parents).path(i))
                                                                 for i in range(len(tokens))])  # fmt: skip


class FakeArm:
    def __init__(self, name: str, depth: int = 4) -> None:
        self.name, self.nodes = name, NodeAcceptance(depth)


def test_node_acceptance_trusts_the_drafter_until_evidence_says_otherwise():
    estimate = NodeAcceptance(max_depth=3)
    assert estimate.rate(1, 0.9) == pytest.approx(0.9) and estimate.rate(2, None) == 0.5
    for _ in range(300):
        estimate.update(1, 0.5, True)
        estimate.update(1, 0.5, False)  # kept as often as the drafter says
    assert estimate.rate(1, 0.5) == pytest.approx(0.5, abs=0.02)
    assert estimate.rate(2, 0.9) == pytest.approx(0.9, abs=0.03)  # no evidence there: the drafter's word


def test_node_acceptance_discounts_every_probability_of_a_drafter_that_overpromises():
    estimate = NodeAcceptance(max_depth=3)
    for i in range(300):
        estimate.update(1, 0.9, i % 10 == 0)  # kept a ninth as often as promised
    assert estimate.rate(1, 0.9) == pytest.approx(0.1, abs=0.03)
    # Cells without evidence of their own (another depth, another probability) are discounted alike.
    assert estimate.rate(3, 0.9) == pytest.approx(0.1, abs=0.03)
    assert estimate.rate(2, 0.4) == pytest.approx(0.4 / 9, abs=0.02)
    assert estimate.rate(2, 0.4, rank=1) == pytest.approx(0.4)  # other ranks are calibrated apart
    for _ in range(300):
        estimate.update(1, 0.9, False)
    assert estimate.rate(1, 0.9) < 0.02


def test_node_acceptance_tells_a_drafters_first_choice_from_its_others():
    estimate = NodeAcceptance(max_depth=3)
    for _ in range(300):
        estimate.update(2, 0.2, True, rank=0)  # first choices at p = 0.2 are always kept
        estimate.update(2, 0.2, False, rank=1)  # second choices at the same p never
    assert estimate.rate(2, 0.2, rank=0) > 0.95 and estimate.rate(2, 0.2, rank=1) < 0.05
    assert estimate.rate(2, 0.2, rank=5) == pytest.approx(0.2)  # later ranks: no evidence yet


def test_a_chain_arm_starts_from_its_drafters_first_choice_evidence():
    adaptive = AdaptiveDrafter({"junk": JunkTrees()}, FLAT_COSTS)
    tree_arm, chain_arm = adaptive.arms
    assert chain_arm.name == "junk chain" and chain_arm.rate(1) == 0.5
    for _ in range(100):
        tree_arm.acceptance.update(1, None, False)  # its first choices, shadowed, are never kept
    assert chain_arm.rate(1) < 0.03  # before any chain of its own was sent
    for _ in range(100):
        chain_arm.acceptance.update(1, None, True)
    assert chain_arm.rate(1) > 0.95  # its own evidence outweighs the prior


def test_merged_trees_share_paths_and_siblings_never_sum_past_one():
    a, b = FakeArm("a"), FakeArm("b")
    first = TokenTree(tokens=[5, 6, 7], parents=[-1, 0, -1])  # 5 -> 6, and 7
    second = TokenTree(tokens=[5, 8, 9], parents=[-1, 0, -1])  # 5 -> 8, and 9
    candidates = merge([(a, first, [0.9, 0.8, 0.6]), (b, second, [0.5, 0.7, 0.6])])
    paths = {tuple(candidates.tokens[i] for i in TokenTree(candidates.tokens, candidates.parents).path(n)): n
             for n in range(len(candidates.tokens))}  # fmt: skip
    assert sorted(paths) == [(5,), (5, 6), (5, 8), (7,), (9,)]  # one node 5, distinct siblings
    assert candidates.owners[paths[(5,)]] == {"a", "b"}
    roots = [n for n, parent in enumerate(candidates.parents) if parent == ROOT]
    assert sum(candidates.path[n] for n in roots) == pytest.approx(1.0)  # 0.9 + 0.6 + 0.6 scaled down
    assert candidates.path[paths[(5,)]] == pytest.approx(0.9 / 2.1)  # the higher of 0.9 and 0.5
    kids = [paths[(5, 6)], paths[(5, 8)]]
    assert sum(candidates.path[n] for n in kids) == pytest.approx(candidates.path[paths[(5,)]])  # 0.8 + 0.7 > 1
    ranked = candidates.ranked(5)
    assert all(candidates.parents[n] == ROOT or candidates.parents[n] in ranked[:i] for i, n in enumerate(ranked))


def test_adaptive_trees_equal_transformers_greedy(verifier, draft_dir):
    from polyspec.models import LoadedModel

    draft = LoadedModel.load(str(draft_dir), dtype="float32")
    adaptive = Recording(
        {
            "lookup": PromptLookupDrafter(),
            "random": RandomDrafter(),
            "model": ModelDrafter(draft, verifier.vocab_size),
            "junk": JunkTrees(),
        },
        FLAT_COSTS,
    )
    decoder = Decoder(verifier)
    for penalty, (gamma, budget) in [(1.0, (3, 8)), (1.3, (5, 16))]:
        sampling = SamplingConfig(temperature=0.0, repetition_penalty=penalty)
        for prompt in random_prompts(5, seed=gamma):
            result = decoder.generate(prompt, adaptive, gamma=gamma, tree=budget, sampling=sampling, max_new_tokens=30)
            assert result.token_ids == hf_greedy(verifier.model, prompt, 30, repetition_penalty=penalty)
            s = result.stats
            assert s.nodes_verified == s.proposed + s.verifier_calls
    branched = [tree for tree in adaptive.sent if not tree.is_chain]
    assert branched and any(len(tree) > 4 for tree in branched)  # real trees, not only chains
    assert any(" | " in route for route in adaptive.route)  # trees merged from several drafters


def test_a_tree_that_cannot_pay_is_never_sent(verifier):
    # Each position costs a full step: no tree is worth its width, however good the drafter.
    linear = VerifyCosts((1, 2, 4, 8, 16), (1.0, 2.0, 4.0, 8.0, 16.0))
    adaptive = AdaptiveDrafter({"lookup": PromptLookupDrafter(), "junk": JunkTrees()}, linear, observe_costs=False)
    decoder = Decoder(verifier)
    for prompt in random_prompts(4, seed=4):
        result = decoder.generate(prompt, adaptive, gamma=4, tree=16, max_new_tokens=30)
        assert result.stats.proposed == 0 and result.stats.nodes_verified == result.stats.verifier_calls
    assert set(adaptive.route) == {""} and set(adaptive.widths) == {0}


def test_a_tree_drafter_that_never_pays_ends_in_plain_decoding(verifier):
    costs = VerifyCosts((1, 2, 4, 8, 16), (1.0, 1.03, 1.05, 1.1, 1.3))
    adaptive = AdaptiveDrafter({"junk": JunkTrees()}, costs, observe_costs=False)
    decoder = Decoder(verifier)
    for i, prompt in enumerate(random_prompts(8, seed=1)):
        if i == 4:
            adaptive.route.clear()  # what it does once it has learnt is what counts
        decoder.generate(prompt, adaptive, gamma=4, tree=16, max_new_tokens=40)
    assert adaptive.route[""] > 0.9 * sum(adaptive.route.values())


def test_a_chain_drafter_that_is_always_right_drafts_long_in_tree_mode(verifier):
    prompt = [2, 9, 13, 5]
    oracle = OracleDrafter(prompt, hf_greedy(verifier.model, prompt, 80))
    adaptive = AdaptiveDrafter({"oracle": oracle, "junk": JunkTrees()}, FLAT_COSTS, observe_costs=False)
    result = Decoder(verifier).generate(prompt, adaptive, gamma=8, tree=16, max_new_tokens=80)
    assert result.token_ids == hf_greedy(verifier.model, prompt, 80)
    assert result.stats.tokens_per_call > 4


@pytest.mark.slow
def test_sampled_adaptive_trees_follow_the_exact_distribution(verifier, draft_dir):
    from polyspec.models import LoadedModel

    draft = LoadedModel.load(str(draft_dir), dtype="float32")
    adaptive = Recording(
        {
            "lookup": PromptLookupDrafter(),
            # Point-mass trees, pruned freely, and its own chains drawn from rows, by the chain rule.
            "model": ModelDrafter(draft, verifier.vocab_size),
        },
        FLAT_COSTS,
        observe_costs=False,  # drafts pay against this curve, however fast the tiny verifier is
    )
    check_sampling_is_exact(verifier, adaptive, trials=500, tree=6)
    assert any(not tree.is_chain for tree in adaptive.sent)
    assert any(tree.probs is not None for tree in adaptive.sent)  # the model's sampled chains were sent too


def test_drawn_trees_fit_the_node_budget():
    assert within_budget((4, 1, 1), 16) == (4, 1, 1)
    assert within_budget((4, 1, 1), 6) == (4,)
    assert within_budget((4, 1, 1), 3) == (3,)
    assert within_budget((2, 2), 6) == (2, 2)
    assert within_budget((2, 2), 5) == (2,)
    assert within_budget((1, 1, 1), 0) == ()


@pytest.mark.slow
def test_sampled_adaptive_trees_with_drawn_policies_follow_the_exact_distribution(verifier, tokenizer, tmp_path):
    from fixtures import greedy_text_ngram

    from polyspec.specs import make_drafter

    path = greedy_text_ngram(verifier, tokenizer, tmp_path)
    adaptive = AdaptiveDrafter(
        {"ngram+context": make_drafter(f"ngram:{path}+context", verifier)}, FLAT_COSTS, observe_costs=False
    )
    check_sampling_is_exact(verifier, adaptive, trials=500, tree=6)
    assert min(adaptive.policies.tries.values()) >= 4  # the bandit weighed every policy
    assert any(route.endswith(", 4 draws") for route in adaptive.route)  # drawn trees were sent
