"""Token trees in `CachedLM`: one forward of a tree gives every node the logits of its own
root-to-node chain, and `keep` leaves the cache exactly as a fresh forward of prefix + path."""

from __future__ import annotations

import random

import pytest
import torch
from fixtures import tiny_gemma, tiny_llama, tiny_qwen35

from polyspec.cached_lm import CachedLM
from polyspec.errors import UserError

FACTORIES = [tiny_llama, tiny_gemma]  # tiny Gemma 3 alternates sliding (window 8) and full attention


def random_tree(rng: random.Random, size: int, chain: int = 0) -> list[int]:
    """Parents of a random tree of `size` nodes whose first `chain` nodes form one branch."""
    parents = [-1]
    for i in range(1, size):
        parents.append(i - 1 if i < chain else rng.randrange(i))
    return parents


def path_to(parents: list[int], node: int) -> list[int]:
    path = []
    while node != -1:
        path.append(node)
        node = parents[node]
    return path[::-1]


def leaves(parents: list[int]) -> list[int]:
    return [i for i in range(len(parents)) if i not in parents]


def full_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([tokens])).logits[0]


def fresh_cache(model, tokens: list[int]):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([tokens]), past_key_values=cache, use_cache=True)
    return cache


def assert_same_cache(lm: CachedLM, model, tokens: list[int]) -> None:
    """Every layer holds what a fresh forward of `tokens` holds (sliding layers: what they still
    need, their last window - 1 entries)."""
    fresh = fresh_cache(model, tokens)
    assert lm.length == len(tokens)
    for index, (mine, theirs) in enumerate(zip(lm.cache.layers, fresh.layers, strict=True)):
        width = theirs.keys.shape[-2]
        assert mine.get_seq_length() == theirs.get_seq_length() == len(tokens)
        assert mine.keys.shape[-2] >= width
        for name in ("keys", "values"):
            torch.testing.assert_close(
                getattr(mine, name)[..., -width:, :], getattr(theirs, name), atol=1e-5, rtol=1e-5, msg=f"{name} {index}"
            )


@pytest.mark.parametrize("factory", FACTORIES)
@pytest.mark.parametrize(("prefix_length", "size", "chain"), [(5, 9, 0), (12, 16, 3), (30, 16, 10), (40, 32, 0)])
def test_tree_logits_equal_chain_forwards_of_each_path(factory, prefix_length, size, chain):
    model = factory(seed=3)
    rng = random.Random(prefix_length * 100 + size)
    prefix = [rng.randrange(4, 64) for _ in range(prefix_length)]
    parents = random_tree(rng, size, chain)
    tokens = [rng.randrange(4, 64) for _ in parents]
    lm = CachedLM(model)
    lm.reset()
    lm.forward(prefix, num_logits=1)
    logits = lm.forward(tokens, parents=parents)
    assert logits.shape == (size, model.config.vocab_size)
    for node in range(size):
        chain_tokens = prefix + [tokens[i] for i in path_to(parents, node)]
        torch.testing.assert_close(logits[node], full_logits(model, chain_tokens)[-1], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("factory", FACTORIES)
def test_keep_equals_a_fresh_forward_of_prefix_and_path(factory):
    model = factory(seed=4)
    rng = random.Random(1)
    lm = CachedLM(model)
    for prefix_length, size, chain in [(3, 8, 0), (10, 16, 4), (25, 12, 9), (9, 32, 0)]:
        prefix = [rng.randrange(4, 64) for _ in range(prefix_length)]
        parents = random_tree(rng, size, chain)
        tokens = [rng.randrange(4, 64) for _ in parents]
        path = path_to(parents, rng.choice(leaves(parents)))
        lm.reset()
        lm.forward(prefix)
        lm.forward(tokens, parents=parents)
        lm.keep(path)
        kept = prefix + [tokens[i] for i in path]
        assert_same_cache(lm, model, kept)
        after = lm.forward([5, 6])  # and decoding goes on as if only the path had been fed
        torch.testing.assert_close(after, full_logits(model, [*kept, 5, 6])[-2:], atol=2e-5, rtol=1e-5)


def test_trees_step_after_step_past_the_sliding_window():
    """The decode loop's pattern: tree, keep a path, tree again, far past Gemma 3's window of 8."""
    model = tiny_gemma(seed=6)
    rng = random.Random(2)
    lm = CachedLM(model)
    sequence = [2, 7, 9]
    lm.reset()
    lm.forward(sequence[:-1])
    for step in range(12):
        parents = random_tree(rng, rng.randint(1, 12), chain=rng.randint(0, 10))
        tokens = [sequence[-1], *(rng.randrange(4, 64) for _ in parents[1:])]
        logits = lm.forward(tokens, parents=parents)
        node = rng.choice(leaves(parents))
        path = path_to(parents, node)
        expected = full_logits(model, sequence[:-1] + [tokens[i] for i in path])[-1]
        torch.testing.assert_close(logits[node], expected, atol=2e-5, rtol=1e-5, msg=f"step {step}")
        lm.keep(path)
        sequence = sequence[:-1] + [tokens[i] for i in path] + [rng.randrange(4, 64)]
    assert lm.length == len(sequence) - 1 > 3 * 8
    assert_same_cache(lm, model, sequence[:-1])


def test_keep_of_a_prefix_path_and_chains_as_trees():
    model = tiny_llama(seed=7)
    lm = CachedLM(model)
    lm.reset()
    lm.forward([2, 5, 6])
    chain = [9, 10, 11, 12]
    logits = lm.forward(chain, parents=[-1, 0, 1, 2])
    torch.testing.assert_close(logits, full_logits(model, [2, 5, 6, *chain])[-4:], atol=2e-5, rtol=1e-5)
    lm.keep([0, 1])
    assert_same_cache(lm, model, [2, 5, 6, 9, 10])


def test_bad_trees_and_paths_are_refused():
    lm = CachedLM(tiny_llama(seed=8))
    lm.reset()
    lm.forward([2, 5])
    with pytest.raises(ValueError):
        lm.forward([4, 5, 6], parents=[-1, 2, 0])  # a parent after its child
    with pytest.raises(ValueError):
        lm.forward([4, 5], parents=[-1])
    with pytest.raises(ValueError):
        lm.keep([0])  # no tree was fed
    lm.forward([4, 5, 6, 7], parents=[-1, 0, 0, 1])
    for path in ([1, 3], [0, 2, 3], [0, 3, 1], [0, 5]):
        with pytest.raises(ValueError):
            lm.keep(path)
    with pytest.raises(ValueError):
        lm.rollback(lm.length - 1)  # nodes 0, 1, 2 are not a chain
    lm.rollback(lm.length - 2)  # nodes 0 and 1 are
    assert lm.length == 4


def test_hybrid_models_refuse_trees_with_a_user_error():
    lm = CachedLM(tiny_qwen35(seed=5))
    lm.reset()
    lm.forward([2, 5, 6])
    with pytest.raises(UserError, match="chains only"):
        lm.forward([7, 8, 9], parents=[-1, 0, 0])
    assert lm.tree_support() is not None
    assert CachedLM(tiny_llama(seed=1)).tree_support() is None
