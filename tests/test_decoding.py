"""Speculative decoding is lossless: greedy output equals transformers' own greedy decoding for
every drafter, and sampled output follows the exact distribution of plain sampling."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from fixtures import SAMPLING, check_sampling_is_exact, hf_greedy, random_prompts, tiny_gemma, tiny_llama

from polyspec.cached_lm import CachedLM
from polyspec.decoding import Decoder
from polyspec.drafters.model import ModelDrafter
from polyspec.drafters.prompt_lookup import PromptLookupDrafter
from polyspec.errors import UserError
from polyspec.models import LoadedModel
from polyspec.sampling import SamplingConfig


@pytest.fixture(scope="module")
def draft_model(draft_dir):
    return LoadedModel.load(str(draft_dir), dtype="float32")


def drafters(verifier, draft_model):
    return {
        "none": None,
        "prompt-lookup": PromptLookupDrafter(1, 3),
        "model": ModelDrafter(draft_model, verifier.vocab_size),
    }


def test_greedy_identity_with_transformers_for_every_drafter_and_gamma(verifier, draft_model):
    decoder = Decoder(verifier)
    max_new = 40  # several times the sliding window of 8
    accepted_any = set()
    for prompt in random_prompts(12, seed=0):
        expected = hf_greedy(verifier.model, prompt, max_new)
        for (name, drafter), gamma in itertools.product(drafters(verifier, draft_model).items(), [1, 2, 3, 5]):
            result = decoder.generate(prompt, drafter, gamma=gamma, max_new_tokens=max_new)
            assert result.token_ids == expected, (name, gamma, prompt)
            assert result.stats.new_tokens == len(expected)
            if result.stats.accepted:
                accepted_any.add(name)
    assert accepted_any == {"prompt-lookup", "model"}  # the drafts were not all rejected


def test_greedy_identity_with_repetition_penalty(verifier, draft_model):
    decoder = Decoder(verifier)
    sampling = SamplingConfig(temperature=0.0, repetition_penalty=1.3)
    for prompt in random_prompts(5, seed=1):
        expected = hf_greedy(verifier.model, prompt, 30, repetition_penalty=1.3)
        for name, drafter in drafters(verifier, draft_model).items():
            result = decoder.generate(prompt, drafter, gamma=3, sampling=sampling, max_new_tokens=30)
            assert result.token_ids == expected, name


def test_greedy_identity_on_a_model_without_sliding_window(tokenizer, tmp_path):
    from fixtures import save

    llama = LoadedModel.load(str(save(tiny_llama(seed=3), tokenizer, tmp_path)), dtype="float32")
    decoder = Decoder(llama)
    for prompt in random_prompts(5, seed=2):
        expected = hf_greedy(llama.model, prompt, 30)
        assert decoder.generate(prompt, PromptLookupDrafter(), gamma=4, max_new_tokens=30).token_ids == expected


def test_never_more_than_max_new_tokens_and_eos_stops(verifier):
    decoder = Decoder(verifier)
    prompt = [2, 5, 6, 7, 5, 6, 7, 5, 6]
    for max_new in [1, 2, 3, 7]:
        result = decoder.generate(prompt, PromptLookupDrafter(), gamma=5, max_new_tokens=max_new)
        assert len(result.token_ids) == max_new and result.stop_reason == "length"
    plain = decoder.generate(prompt, None, max_new_tokens=20)
    eos = plain.token_ids[4]  # pretend the fifth token is the end of sequence
    result = decoder.generate(prompt, PromptLookupDrafter(), gamma=5, max_new_tokens=20, eos_token_ids=frozenset({eos}))
    first = plain.token_ids.index(eos)
    assert result.token_ids == plain.token_ids[: first + 1] and result.stop_reason == "eos"


def test_stop_string_cuts_after_the_completing_token(verifier):
    decoder = Decoder(verifier)
    prompt = [2, 9, 10, 11]
    plain = decoder.generate(prompt, None, max_new_tokens=12)
    words = verifier.tokenizer.decode(plain.token_ids[3:5])
    result = decoder.generate(prompt, PromptLookupDrafter(), gamma=4, max_new_tokens=12, stop_strings=[words])
    assert result.stop_reason == "stop_string"
    assert words in result.text
    assert words not in verifier.tokenizer.decode(result.token_ids[:-1])
    assert result.token_ids == plain.token_ids[: len(result.token_ids)]


def test_statistics_are_consistent(verifier, draft_model):
    decoder = Decoder(verifier)
    result = decoder.generate(
        [2, 4, 5, 4, 5, 4, 5], ModelDrafter(draft_model, verifier.vocab_size), gamma=4, max_new_tokens=30
    )
    s = result.stats
    assert s.new_tokens == s.accepted + s.verifier_calls  # each call adds its accepted tokens plus one
    assert s.accepted <= s.drafted <= s.proposed
    assert s.reached[0] >= max(s.reached) and sum(s.accepted_at) == s.accepted
    assert s.draft_seconds > 0 and s.verify_seconds > 0 and s.draft_seconds + s.verify_seconds <= s.seconds


@pytest.mark.parametrize("factory", [tiny_gemma, tiny_llama])
def test_rollback_leaves_the_cache_as_if_only_kept_tokens_were_fed(factory):
    model = factory(seed=5)
    rng = random.Random(0)
    lm = CachedLM(model)
    for length, fed, keep in [(3, 4, 1), (7, 5, 2), (20, 6, 3), (30, 4, 4), (12, 3, 0)]:
        tokens = [rng.randrange(4, 64) for _ in range(length + fed + 2)]
        lm.reset()
        lm.forward(tokens[:length])
        lm.forward(tokens[length : length + fed])  # a draft verified ...
        lm.rollback(length + keep)  # ... and partly rejected
        next_tokens = tokens[length + keep : length + keep + 2]
        after = lm.forward(next_tokens)
        with torch.inference_mode():
            fresh = model(torch.tensor([tokens[: length + keep + 2]])).logits[0, -2:]
        torch.testing.assert_close(after, fresh, atol=1e-5, rtol=1e-5)


def test_rollback_beyond_the_cache_is_refused(verifier):
    lm = CachedLM(verifier.model)
    lm.reset()
    lm.forward([2, 5, 6])
    with pytest.raises(ValueError):
        lm.rollback(4)


@pytest.mark.slow
@pytest.mark.parametrize("drafter_name", ["none", "prompt-lookup", "model"])
def test_sampled_output_follows_the_exact_distribution(verifier, draft_model, drafter_name):
    drafter = drafters(verifier, draft_model)[drafter_name]
    check_sampling_is_exact(verifier, drafter, trials=800, expect_drafts=drafter_name != "none")


def test_sampling_is_reproducible_with_a_seed(verifier):
    decoder = Decoder(verifier)
    runs = [
        decoder.generate([2, 5, 6], PromptLookupDrafter(), sampling=SAMPLING, max_new_tokens=15, seed=4)
        for _ in range(2)
    ]
    assert runs[0].token_ids == runs[1].token_ids


@pytest.mark.parametrize(
    "kwargs",
    [{"gamma": 0}, {"max_new_tokens": 0}, {"max_new_tokens": 600}],
)
def test_bad_generation_settings_are_user_errors(verifier, kwargs):
    with pytest.raises(UserError):
        Decoder(verifier).generate([2, 5], None, **kwargs)


def test_empty_prompt_is_a_user_error(verifier):
    with pytest.raises(UserError):
        Decoder(verifier).generate([], None)
    with pytest.raises(UserError):
        Decoder(verifier).encode("")
