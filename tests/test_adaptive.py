"""Adaptive drafting stays lossless, drafts nothing when drafts do not pay, and drafts long
when they do."""

from __future__ import annotations

import random

import pytest
from fixtures import check_sampling_is_exact, hf_greedy, random_prompts

from polyspec.decoding import Decoder
from polyspec.drafters.adaptive import AdaptiveDrafter, DepthAcceptance, VerifyCosts, measure_verify_costs
from polyspec.drafters.model import ModelDrafter
from polyspec.drafters.prompt_lookup import PromptLookupDrafter
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


def test_measured_costs_are_positive_for_every_width(verifier):
    costs = measure_verify_costs(verifier.model, widths=(1, 4), context=16, repeats=1)
    assert costs.widths == (1, 4) and all(s > 0 for s in costs.seconds)


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


class OracleDrafter:
    """Proposes the verifier's own greedy continuation, known in advance: always right, free."""

    def __init__(self, prompt: list[int], continuation: list[int]) -> None:
        self.text = prompt + continuation

    def start(self, prompt_ids, processor, generator) -> None:
        pass

    def propose(self, context, k) -> Draft:
        return Draft(tokens=self.text[len(context) : len(context) + k])


def test_a_drafter_that_is_always_right_drafts_long(verifier):
    prompt = [2, 9, 13, 5]
    oracle = OracleDrafter(prompt, hf_greedy(verifier.model, prompt, 80))
    adaptive = AdaptiveDrafter({"oracle": oracle, "random": RandomDrafter()}, FLAT_COSTS)
    result = Decoder(verifier).generate(prompt, adaptive, gamma=8, max_new_tokens=80)
    assert result.stats.tokens_per_call > 4
    assert adaptive.route["oracle"] > 5 * adaptive.route["random"]


def test_a_costly_drafter_that_is_right_only_as_often_as_it_costs_is_not_used(verifier):
    # The verifier as its own drafter is always right, but each token costs a full step.
    adaptive = AdaptiveDrafter({"self": ModelDrafter(verifier, verifier.vocab_size)}, FLAT_COSTS)
    decoder = Decoder(verifier)
    for prompt in random_prompts(3, seed=2):
        decoder.generate(prompt, adaptive, gamma=4, max_new_tokens=40)
    assert adaptive.route[""] > 0.8 * sum(adaptive.route.values())


@pytest.mark.slow
def test_sampled_output_follows_the_exact_distribution(verifier, draft_dir):
    from polyspec.models import LoadedModel

    draft = LoadedModel.load(str(draft_dir), dtype="float32")
    adaptive = AdaptiveDrafter(
        {"lookup": PromptLookupDrafter(), "model": ModelDrafter(draft, verifier.vocab_size)}, FLAT_COSTS
    )
    check_sampling_is_exact(verifier, adaptive, trials=800)


def test_generate_cli_with_adaptive_drafting_is_lossless(verifier, verifier_dir, monkeypatch, capsys, tmp_path):
    import json

    from fixtures import run_cli

    monkeypatch.setenv("POLYSPEC_HOME", str(tmp_path))
    prompt = "w5 w6 w7 w5 w6 w7 w5"
    args = ["generate", "--verifier", str(verifier_dir), "--dtype", "float32", "--prompt", prompt, "--json"]
    code, out, err = run_cli(monkeypatch, capsys, *args, "--drafter", "adaptive:prompt-lookup;prompt-lookup:2-4",
                             "--gamma", "6", "--max-new-tokens", "30")  # fmt: skip
    assert code == 0, err
    ids = verifier.tokenizer(prompt)["input_ids"]
    assert json.loads(out)["token_ids"] == hf_greedy(verifier.model, ids, 30)
    assert list((tmp_path / "verify-costs").glob("*.json"))  # measured once, kept for the next run
    code, _, err = run_cli(monkeypatch, capsys, *args, "--drafter", "adaptive:oops")
    assert code == 2 and "unknown drafter" in err and "Traceback" not in err
