"""The shared logits processing matches transformers' own processors, row by row."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from polyspec.errors import UserError
from polyspec.sampling import LogitsProcessor, SamplingConfig


def reference_probs(logits, context, config: SamplingConfig) -> torch.Tensor:
    """transformers' processors, one row at a time with its own context."""
    rows = []
    for j in range(logits.shape[0]):
        ids = torch.tensor([context[: len(context) - logits.shape[0] + 1 + j]])
        if config.penalty_window:
            ids = ids[:, -config.penalty_window :]
        scores = logits[j : j + 1].clone()
        if config.repetition_penalty != 1.0 and ids.shape[1]:
            scores = RepetitionPenaltyLogitsProcessor(config.repetition_penalty)(ids, scores)
        scores = TemperatureLogitsWarper(config.temperature)(ids, scores)
        if config.top_k:
            scores = TopKLogitsWarper(config.top_k)(ids, scores)
        if config.top_p < 1:
            scores = TopPLogitsWarper(config.top_p)(ids, scores)
        rows.append(torch.softmax(scores, dim=-1))
    return torch.cat(rows)


@pytest.mark.parametrize(
    "config",
    [
        SamplingConfig(temperature=1.0),
        SamplingConfig(temperature=0.7, top_k=5),
        SamplingConfig(temperature=1.3, top_p=0.8),
        SamplingConfig(temperature=1.0, top_k=50, top_p=0.9, repetition_penalty=1.1, penalty_window=16),
        SamplingConfig(temperature=1.0, top_k=7, top_p=0.5, repetition_penalty=1.5),
    ],
)
@pytest.mark.parametrize("seed", range(5))
def test_probs_match_transformers_processors(config, seed):
    generator = torch.Generator().manual_seed(seed)
    vocab, rows = 100, 4
    logits = torch.randn(rows, vocab, generator=generator) * 3
    context = torch.randint(0, vocab, (30,), generator=generator).tolist()
    # Row j sees context[: len - rows + 1 + j], as when verifying rows - 1 draft tokens.
    start = len(context) - rows + 1
    ours = LogitsProcessor(config).probs(logits, context, start)
    theirs = reference_probs(logits, context, config)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)
    assert torch.allclose(ours.sum(-1), torch.ones(rows))


def test_repetition_penalty_uses_only_the_window():
    logits = torch.full((1, 10), 2.0)
    config = SamplingConfig(temperature=0.0, repetition_penalty=2.0, penalty_window=2)
    out = LogitsProcessor(config).penalize(logits, [1, 2, 3], start=3)
    assert out[0, 1] == 2.0  # outside the window of the last 2 tokens
    assert out[0, 2] == 1.0 and out[0, 3] == 1.0
    assert logits[0, 2] == 2.0  # input untouched


def test_greedy_tokens_are_argmax_after_penalty():
    logits = torch.tensor([[1.0, 3.0, 2.9]])
    plain = LogitsProcessor(SamplingConfig()).greedy_tokens(logits, [1], 1)
    penalized = LogitsProcessor(SamplingConfig(repetition_penalty=1.2)).greedy_tokens(logits, [1], 1)
    assert plain == [1] and penalized == [2]


@pytest.mark.parametrize(
    "kwargs", [{"temperature": -1}, {"top_k": -2}, {"top_p": 0}, {"top_p": 1.5}, {"repetition_penalty": 0}]
)
def test_invalid_settings_are_user_errors(kwargs):
    with pytest.raises(UserError):
        SamplingConfig(**kwargs)


@pytest.mark.parametrize(
    "config",
    [
        SamplingConfig(temperature=1.0, top_k=50, top_p=0.9, repetition_penalty=1.1, penalty_window=16),
        SamplingConfig(temperature=0.8, top_k=7, repetition_penalty=1.5),
        SamplingConfig(temperature=1.0, repetition_penalty=1.3, penalty_window=3),
    ],
)
@pytest.mark.parametrize("seed", range(4))
def test_rows_after_their_own_paths_match_transformers(config, seed):
    """Token-tree rows: row j after ids + suffixes[j], each as transformers would process it."""
    generator = torch.Generator().manual_seed(seed)
    vocab = 60
    ids = torch.randint(0, vocab, (20,), generator=generator).tolist()
    suffixes = [[], [5], [5, 9], [7], [7, 7, 3, 1, 2]]
    logits = torch.randn(len(suffixes), vocab, generator=generator) * 3
    processor = LogitsProcessor(config)
    ours = processor.probs_after(logits, ids, suffixes)
    for j, suffix in enumerate(suffixes):
        context = [*ids, *suffix]
        theirs = reference_probs(logits[j : j + 1], context, config)
        torch.testing.assert_close(ours[j : j + 1], theirs, atol=1e-6, rtol=1e-5)
    greedy = LogitsProcessor(
        SamplingConfig(repetition_penalty=config.repetition_penalty, penalty_window=config.penalty_window)
    )
    expected = [int(processor.penalize_after(logits[j : j + 1], ids, [s]).argmax()) for j, s in enumerate(suffixes)]
    assert greedy.greedy_after(logits, ids, suffixes) == expected


def test_rows_after_a_chain_equal_the_chain_rows():
    generator = torch.Generator().manual_seed(3)
    config = SamplingConfig(temperature=1.0, top_k=10, repetition_penalty=1.4, penalty_window=5)
    ids = torch.randint(0, 40, (12,), generator=generator).tolist()
    draft = [3, 8, 3]
    logits = torch.randn(len(draft) + 1, 40, generator=generator) * 3
    processor = LogitsProcessor(config)
    chain = processor.probs(logits, ids, len(ids), draft)
    after = processor.probs_after(logits, ids, [draft[:j] for j in range(len(draft) + 1)])
    torch.testing.assert_close(after, chain)
