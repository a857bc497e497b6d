"""Stateful families beyond Qwen3.5's hybrid: Mamba (selective state space), LFM2 (short
convolutions), a Qwen3.5 whose layers are all linear attention (no attention layer at all), Bamba
(Mamba-2 layers with attention) and RecurrentGemma (recurrence and convolution states kept on its
modules, not in a cache); also DeepSeek V3.2, whose sparse-attention indexer makes a wide forward
differ from single-token decoding, so that it is verified a token at a time. Greedy decoding with
drafts is token-identical to transformers' `generate`, and every rollback leaves the cache as if
only the kept tokens had been fed. Tiny random models from the architectures' own config classes
(tiny_models.py)."""

from __future__ import annotations

import json
import random

import pytest
import tiny_models
import torch
from fixtures import hf_greedy, random_prompts, run_cli, save

from polyspec.cached_lm import CachedLM
from polyspec.decoding import Decoder
from polyspec.drafters.model import ModelDrafter
from polyspec.drafters.prompt_lookup import PromptLookupDrafter
from polyspec.models import LoadedModel

ALL_LINEAR = {"layer_types": ["linear_attention"] * 2}
# (model type, config overrides, the policy CachedLM picks)
FAMILIES = [
    ("mamba", None, "refeed"),
    ("lfm2", None, "refeed"),
    ("qwen3_5_text", ALL_LINEAR, "states"),
    ("bamba", None, "refeed"),
    ("recurrent_gemma", None, "refeed"),  # states kept on its modules, fed a token at a time
    # no recurrent state, but its top-k indexer picks keys differently in wide forwards: fed a token at a time
    ("deepseek_v32", None, "crop"),
]
IDS = [f"{model_type}{'-all-linear' if overrides else ''}" for model_type, overrides, _ in FAMILIES]


def greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy tokens; for a model with no attention layer, whose cache transformers'
    `generate` cannot ask for its length, the argmax of full forwards without a cache."""
    if not any(kind != "linear_attention" for kind in getattr(model.config, "layer_types", None) or ["?"]):
        sequence = list(prompt)
        with torch.inference_mode():
            for _ in range(max_new_tokens):
                sequence.append(int(model(torch.tensor([sequence]), use_cache=False).logits[0, -1].argmax()))
                if sequence[-1] == tiny_models.EOS:
                    break
        return sequence[len(prompt) :]
    return hf_greedy(model, prompt, max_new_tokens)


@pytest.fixture(scope="module", params=FAMILIES, ids=IDS)
def family(request, tokenizer):
    model_type, overrides, policy = request.param
    model = tiny_models.tiny_model(model_type, seed=0, overrides=overrides)
    draft = tiny_models.tiny_model(model_type, seed=1, base=model, noise=0.5)
    verifier = LoadedModel(model=model, tokenizer=tokenizer, name=model_type)
    drafter = LoadedModel(model=draft, tokenizer=tokenizer, name=f"noisy-{model_type}")
    return verifier, drafter, policy


def test_greedy_identity_with_transformers(family):
    verifier, draft, policy = family
    decoder = Decoder(verifier)
    assert decoder.lm.policy.name == policy
    model_drafter = ModelDrafter(draft, verifier.vocab_size)
    partial = 0
    for prompt in random_prompts(3, seed=7):
        expected = greedy(verifier.model, prompt, 16)
        for drafter in (PromptLookupDrafter(1, 3), model_drafter):
            result = decoder.generate(prompt, drafter, gamma=3, max_new_tokens=16)
            assert result.token_ids == expected, (type(drafter).__name__, prompt)
            partial += result.stats.accepted < result.stats.drafted
    assert partial  # drafts were cut back, not all accepted


def test_rollback_is_exact(family):
    """After rollbacks into a verify call, into single-token forwards and to the start of a
    forward, the next logits equal those of the kept tokens fed without any rollback (by another
    CachedLM of the same model, whose forwards come in between)."""
    verifier, _, _ = family
    model = verifier.model
    rng = random.Random(0)
    tokens = [2, *(rng.randrange(4, 64) for _ in range(40))]
    lm, fresh = CachedLM(model), CachedLM(model)
    for prompt, widths, keep in [(9, [4], 2), (6, [1, 1, 1], 1), (12, [3], 0), (5, [4], 4), (4, [5], 3)]:
        lm.reset()
        lm.forward(tokens[:prompt])
        fed = prompt
        for width in widths:
            lm.forward(tokens[fed : fed + width])
            fed += width
        kept = prompt + keep
        lm.rollback(kept)
        assert lm.length == kept
        fresh.reset()  # the same chunks, each cut at `kept`: the same rounding as an exact rollback
        start = 0
        for width in [prompt, *widths]:
            if start < kept:
                fresh.forward(tokens[start : min(start + width, kept)])
            start += width
        expected = fresh.forward(tokens[kept : kept + 2])
        after = lm.forward(tokens[kept : kept + 2])  # after the other one's forwards on the same model
        torch.testing.assert_close(after, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_generate_cli_on_a_model_with_no_attention_layer(tmp_path, tokenizer):
    """All-linear Qwen3.5, saved and run through the command line with a drafter of the same
    architecture (transformers' own cache cannot tell such a cache's length)."""
    model = tiny_models.tiny_model("qwen3_5_text", seed=0, overrides=ALL_LINEAR)
    draft = tiny_models.tiny_model("qwen3_5_text", seed=1, base=model)
    verifier_dir, draft_dir = save(model, tokenizer, tmp_path / "v"), save(draft, tokenizer, tmp_path / "d")
    prompt = "w5 w6 w7 w5 w6 w7 w5"
    expected = greedy(model, tokenizer(prompt)["input_ids"], 12)
    for drafter in ("prompt-lookup", f"model:{draft_dir}"):
        code, out, err = run_cli("generate", "--verifier", str(verifier_dir), "--drafter", drafter,
            "--gamma", "3", "--prompt", prompt, "--max-new-tokens", "12", "--dtype", "float32", "--json",
        )  # fmt: skip
        assert code == 0, err
        assert json.loads(out)["token_ids"] == expected
