"""The narrow product layout for linear layers: the same products, greedy output unchanged."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from fixtures import hf_greedy, random_prompts, tiny_gemma

from polyspec import narrow_linear
from polyspec.decoding import Decoder
from polyspec.drafters.prompt_lookup import PromptLookupDrafter
from polyspec.models import LoadedModel
from polyspec.narrow_linear import MAX_ROWS, layout, use_narrow_layout


@pytest.mark.parametrize("bias", [False, True])
def test_every_row_count_gives_the_same_product(bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 300, bias=bias)
    reference = copy.deepcopy(linear)
    assert use_narrow_layout(linear) == 1
    with torch.inference_mode():
        for rows in (1, 2, 3, 7, 16, MAX_ROWS, MAX_ROWS + 1, 200):
            x = torch.randn(1, rows, 48)
            got, want = linear(x), reference(x)
            assert got.shape == want.shape == (1, rows, 300)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            if rows == 1 or rows > MAX_ROWS:  # torch's own kernel: bit for bit
                assert torch.equal(got, F.linear(x, reference.weight, reference.bias))


def test_one_row_through_a_large_weight_goes_as_two(monkeypatch):
    monkeypatch.setattr(narrow_linear, "PAIR_MIN_WEIGHT", 48 * 300)
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 300)
    reference = copy.deepcopy(linear)
    use_narrow_layout(linear)
    x = torch.randn(1, 1, 48)
    with torch.inference_mode():
        want = reference(x)
        products, mm = [], torch.mm
        monkeypatch.setattr(torch, "mm", lambda a, b: products.append(tuple(b.shape)) or mm(a, b))
        got = linear(x)
    assert products == [(48, 2)] and got.shape == (1, 1, 300)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_training_keeps_torchs_kernel_and_its_gradients():
    torch.manual_seed(0)
    linear = torch.nn.Linear(8, 5)
    use_narrow_layout(linear)
    x = torch.randn(4, 8, requires_grad=True)
    out = linear(x)
    assert torch.equal(out, F.linear(x, linear.weight, linear.bias))
    out.sum().backward()
    assert linear.weight.grad is not None and x.grad is not None


def test_only_float32_plain_linears_are_switched(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4).to(torch.bfloat16))
    assert use_narrow_layout(model) == 1 and layout(model) == "narrow"
    monkeypatch.setenv("POLYSPEC_NARROW_LINEAR", "0")
    other = torch.nn.Linear(4, 4)
    assert use_narrow_layout(other) == 0 and layout(other) == "torch"


def test_loaded_cpu_float32_models_use_it(verifier):
    assert layout(verifier.model) == "narrow" and verifier.model.narrow_linear_layers > 0


@pytest.mark.parametrize("tree", [0, 8])
def test_greedy_output_matches_transformers_without_it(verifier_dir, tree):
    """Speculative output with the narrow layout equals transformers' generate() on the same
    weights with torch's kernel, chains and trees."""
    narrow = LoadedModel.load(str(verifier_dir), dtype="float32")
    stock = tiny_gemma(seed=1)  # the weights saved in verifier_dir
    assert layout(narrow.model) == "narrow" and layout(stock) == "torch"
    decoder = Decoder(narrow)
    for prompt in random_prompts(6, seed=3):
        got = decoder.generate(prompt, PromptLookupDrafter(), gamma=4, tree=tree, max_new_tokens=24)
        assert got.token_ids == hf_greedy(stock, prompt, len(got.token_ids))
