"""Speculative decoding on hybrid models (Qwen3.5: gated delta-net linear attention with full
attention every fourth layer) is lossless: after a partial acceptance every layer is exactly as
if only the kept tokens had been fed. Tiny random Qwen3.5 models are built from a config here."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from fixtures import chi_square_pvalue, exact_joint, hf_greedy, random_prompts, run_cli, tiny_qwen35

from polyspec.cached_lm import CachedLM
from polyspec.decoding import Decoder
from polyspec.drafters.model import ModelDrafter
from polyspec.drafters.prompt_lookup import PromptLookupDrafter
from polyspec.errors import UserError
from polyspec.models import LoadedModel
from polyspec.sampling import SamplingConfig
from polyspec.state_rollback import DEFAULT_STEP_LIMIT, stepwise_delta_rule


@pytest.fixture(scope="module")
def verifier(tokenizer) -> LoadedModel:
    return LoadedModel(model=tiny_qwen35(seed=1), tokenizer=tokenizer, name="tiny-qwen3.5")


@pytest.fixture(scope="module")
def draft_model(verifier) -> LoadedModel:
    noisy = tiny_qwen35(seed=2, noise=0.5, base=verifier.model)
    return LoadedModel(model=noisy, tokenizer=verifier.tokenizer, name="noisy-tiny-qwen3.5")


class Recording:
    """Wraps a drafter and keeps (proposed, accepted) for every verifier call but a sequence's
    last: each call adds its accepted tokens plus the verifier's own, so the accepted count is
    read from how much the context grew by the next `propose`."""

    def __init__(self, drafter) -> None:
        self.drafter, self.calls = drafter, []
        self._last: tuple[int, int] | None = None  # (context length, tokens proposed)

    def start(self, prompt_ids, processor, generator) -> None:
        self._last = None
        self.drafter.start(prompt_ids, processor, generator)

    def propose(self, context, k):
        if self._last is not None:
            length, proposed = self._last
            self.calls.append((proposed, len(context) - length - 1))
        draft = self.drafter.propose(context, k)
        self._last = (len(context), len(draft))
        return draft

    def finish(self, length: int) -> None:
        """Record a sequence's last call from its final length (exact when no stop cut it short)."""
        if self._last is not None:
            self.calls.append((self._last[1], length - self._last[0] - 1))
        self._last = None


def longest_rejection_streak(calls) -> int:
    streak = best = 0
    for proposed, accepted in calls:
        streak = streak + 1 if accepted < proposed else 0
        best = max(best, streak)
    return best


def hybrid_drafters(verifier, draft_model):
    return {
        "none": None,
        "prompt-lookup": Recording(PromptLookupDrafter(1, 3)),
        "model": Recording(ModelDrafter(draft_model, verifier.vocab_size)),
    }


def test_greedy_identity_with_transformers_for_every_drafter_and_gamma(verifier, draft_model):
    decoder = Decoder(verifier)
    drafters = hybrid_drafters(verifier, draft_model)
    # gamma 20: a verify call wider than the step limit, cut back by re-feeding.
    configs = [*itertools.product(drafters, [1, 2, 4]), ("prompt-lookup", DEFAULT_STEP_LIMIT + 4)]
    for prompt in random_prompts(6, seed=3):
        expected = hf_greedy(verifier.model, prompt, 24)
        for name, gamma in configs:
            result = decoder.generate(prompt, drafters[name], gamma=gamma, max_new_tokens=24)
            assert result.token_ids == expected, (name, gamma, prompt)
    model_calls = drafters["model"].calls
    assert any(0 < accepted < proposed for proposed, accepted in model_calls)  # cut back mid-draft
    assert any(accepted == proposed for proposed, accepted in model_calls)
    assert longest_rejection_streak(model_calls) >= 3
    assert any(accepted for _, accepted in drafters["prompt-lookup"].calls)


def test_greedy_identity_with_snapshot_and_refeed(verifier, draft_model):
    decoder = Decoder(verifier)
    drafter = ModelDrafter(draft_model, verifier.vocab_size)
    decoder.lm = CachedLM(verifier.model, rollback="refeed")
    drafter.lm = CachedLM(draft_model.model, rollback="refeed")
    for prompt in random_prompts(3, seed=4):
        expected = hf_greedy(verifier.model, prompt, 20)
        for candidate in (drafter, PromptLookupDrafter(1, 3)):
            assert decoder.generate(prompt, candidate, gamma=3, max_new_tokens=20).token_ids == expected


SAMPLING = SamplingConfig(temperature=1.0, top_k=3, top_p=0.95, repetition_penalty=1.3, penalty_window=4)
# Prompt lookup copies recent tokens, which the repetition penalty makes unlikely: without it
# its drafts are often accepted, so this exercises the point-mass path and the cut-backs.
NO_PENALTY = SamplingConfig(temperature=1.0, top_k=3, top_p=0.95)


@pytest.mark.parametrize(
    ("drafter_name", "sampling", "prompt_tokens", "trials"),
    [("model", SAMPLING, 12, 300), ("prompt-lookup", NO_PENALTY, 4, 250)],
)
@pytest.mark.slow
def test_sampled_output_follows_the_exact_distribution(
    verifier, draft_model, drafter_name, sampling, prompt_tokens, trials
):
    decoder = Decoder(verifier)
    # The model's own greedy text starts with a loop, so prompt lookup proposes likely tokens.
    greedy = decoder.generate([2, 7, 8, 9], None, max_new_tokens=prompt_tokens).token_ids
    prompt = [2, 7, 8, 9, *greedy]
    steps = 3
    joint = exact_joint(verifier.model, prompt, sampling, steps)
    drafter = hybrid_drafters(verifier, draft_model)[drafter_name]
    samples = []
    for seed in range(trials):
        result = decoder.generate(
            prompt, drafter, gamma=3, sampling=sampling, max_new_tokens=steps, seed=seed, eos_token_ids=frozenset()
        )
        samples.append(tuple(result.token_ids))
        drafter.finish(len(prompt) + len(result.token_ids))
    assert sum(accepted for _, accepted in drafter.calls) > trials // 10  # the drafts were really used
    # and cut back inside a verify call (with 3 tokens to sample, this model drafter's calls are
    # (2, 0), (1, 1) or (2, 2): it never has one of two tokens accepted)
    assert any(accepted < proposed for proposed, accepted in drafter.calls)
    assert chi_square_pvalue(samples, joint) > 1e-3


def fresh_cache(model, tokens: list[int]):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([tokens]), past_key_values=cache, use_cache=True)
    return cache


def assert_same_states(cache, fresh, length: int) -> None:
    for index, (mine, theirs) in enumerate(zip(cache.layers, fresh.layers, strict=True)):
        if hasattr(theirs, "recurrent_states"):
            # A fresh cache pads short prefixes with zeros; compare the inputs both hold.
            width = min(length, theirs.conv_kernel_size[0])
            conv = mine.conv_states[0][..., -width:]
            torch.testing.assert_close(conv, theirs.conv_states[0][..., -width:], msg=f"conv {index}")
            torch.testing.assert_close(
                mine.recurrent_states[0], theirs.recurrent_states[0], atol=1e-5, rtol=1e-5, msg=f"recurrent {index}"
            )
        else:
            assert mine.keys.shape[-2] == length
            torch.testing.assert_close(mine.keys, theirs.keys, atol=1e-5, rtol=1e-5, msg=f"keys {index}")
            torch.testing.assert_close(mine.values, theirs.values, atol=1e-5, rtol=1e-5, msg=f"values {index}")


# (prompt length, widths of the forwards that follow, how many of their tokens are kept)
ROLLBACKS = [
    (3, [4], 1),
    (7, [5], 2),
    (30, [4], 4),  # everything kept
    (12, [3], 0),  # back to the end of the prompt
    (0, [6], 2),  # into the very first forward
    (12, [1, 1, 1, 1], 2),  # across several single-token forwards, as a model drafter does
    (20, [3, DEFAULT_STEP_LIMIT + 3], 9),  # into the middle of a forward wider than the step limit
]


@pytest.mark.parametrize("mode", ["states", "refeed"])
def test_rollback_restores_conv_recurrent_and_kv_states(mode):
    model = tiny_qwen35(seed=5)
    rng = random.Random(0)
    lm = CachedLM(model, rollback=mode)
    assert lm.policy.name == mode
    for length, widths, keep in ROLLBACKS:
        tokens = [rng.randrange(4, 64) for _ in range(length + sum(widths) + 2)]
        lm.reset()
        if length:
            lm.forward(tokens[:length])
        fed = length
        for width in widths:
            lm.forward(tokens[fed : fed + width])
            fed += width
        kept = length + keep
        lm.rollback(kept)
        assert lm.length == kept
        assert_same_states(lm.cache, fresh_cache(model, tokens[:kept]), kept)
        after = lm.forward(tokens[kept : kept + 2])  # and decoding goes on as if nothing was cut
        with torch.inference_mode():
            fresh = model(torch.tensor([tokens[: kept + 2]])).logits[0, -2:]
        torch.testing.assert_close(after, fresh, atol=1e-5, rtol=1e-5)


def test_rollback_before_the_last_rollback_is_refused():
    lm = CachedLM(tiny_qwen35(seed=5))
    lm.reset()
    lm.forward([2, 5, 6, 7])
    lm.forward([8, 9, 10])
    lm.rollback(5)
    lm.forward([11, 12])
    with pytest.raises(ValueError):
        lm.rollback(4)


def test_the_recording_rule_is_swapped_back_after_each_forward():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as modeling

    originals = (modeling.torch_chunk_gated_delta_rule, modeling.torch_recurrent_gated_delta_rule)
    lm = CachedLM(tiny_qwen35(seed=5))
    lm.reset()
    lm.forward([2, 5, 6])
    assert (modeling.torch_chunk_gated_delta_rule, modeling.torch_recurrent_gated_delta_rule) == originals


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stepwise_rule_equals_single_token_decoding_bitwise(dtype):
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

    torch.manual_seed(0)
    steps, key_heads, value_heads, dim = 5, 2, 4, 8
    query, key = (torch.randn(1, steps, key_heads, dim, dtype=dtype) for _ in range(2))
    value = torch.randn(1, steps, value_heads, dim, dtype=dtype)
    g, beta = -torch.rand(1, steps, value_heads), torch.rand(1, steps, value_heads, dtype=dtype)
    state = torch.randn(1, value_heads, dim, dim)
    out, states = stepwise_delta_rule(query, key, value, g, beta, state, normalize_qk=True)
    for t in range(steps):
        step_out, state = torch_recurrent_gated_delta_rule(
            *(x[:, t : t + 1] for x in (query, key, value)),
            g=g[:, t : t + 1],
            beta=beta[:, t : t + 1],
            initial_state=state,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        assert torch.equal(step_out, out[:, t : t + 1]) and torch.equal(state, states[t])


def test_other_recurrent_layers_roll_back_by_snapshot_and_refeed():
    """LFM2's short convolutions are no gated delta-net: auto picks snapshot and re-feed (exact
    for any copyable state, tests/test_stateful_models.py), and asking for per-position states is
    a one-line error naming the way out."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    config = Lfm2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        layer_types=["conv", "full_attention"],
    )
    model = Lfm2ForCausalLM(config).eval()
    assert CachedLM(model).policy.name == "refeed"
    with pytest.raises(UserError, match="refeed"):
        CachedLM(model, rollback="states")


def test_generate_cli_is_lossless_on_saved_hybrid_models(tmp_path, tokenizer, verifier, draft_model):
    """Through the command line's contract, as a user with Qwen3.5 checkpoints on disk runs it."""
    import json

    verifier.model.save_pretrained(tmp_path / "verifier")
    tokenizer.save_pretrained(tmp_path / "verifier")
    draft_model.model.save_pretrained(tmp_path / "draft")
    tokenizer.save_pretrained(tmp_path / "draft")
    prompt = "w5 w6 w7 w5 w6 w7 w5"
    ids = tokenizer(prompt)["input_ids"]
    expected = hf_greedy(verifier.model, ids, 20)
    for drafter in ("none", "prompt-lookup", f"model:{tmp_path / 'draft'}"):
        args = ["generate", "--verifier", str(tmp_path / "verifier"), "--drafter", drafter, "--gamma", "3"]
        args += ["--prompt", prompt, "--max-new-tokens", "20", "--dtype", "float32", "--json"]
        code, out, err = run_cli(*args)
        assert code == 0, err
        result = json.loads(out)
        assert result["token_ids"] == expected, drafter
