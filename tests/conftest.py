"""Tiny randomly initialised models and a word-level tokenizer, built in the tests (no downloads).

The models are small enough that a test decodes hundreds of tokens in well under a second, and
their sliding window (8 tokens) is short so that sequences outgrow it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from polyspec.models import LoadedModel

# Tiny models gain nothing from a second thread, and tests share the machine.
torch.set_num_threads(1)

VOCAB_WORDS = 60  # plus 4 special tokens
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]


def build_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for i in range(VOCAB_WORDS):
        vocab[f"w{i}"] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


def tiny_gemma(seed: int, layers: int = 4, vocab_size: int | None = None, hidden: int = 32):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=vocab_size or len(SPECIALS) + VOCAB_WORDS,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * (layers // 2),
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    model = Gemma3ForCausalLM(config).eval()
    # Random weights give near-uniform logits; sharpen them so outputs have structure
    # (repeats, confident tokens) like a trained model's, which exercises acceptance.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return model


def tiny_llama(seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(SPECIALS) + VOCAB_WORDS,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run the `polyspec` entry point in-process: (exit code, stdout, stderr)."""
    from polyspec.cli import main

    monkeypatch.setattr(sys, "argv", ["polyspec", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code or 0
    out, err = capsys.readouterr()
    return code, out, err


def save(model, tokenizer, path: Path) -> Path:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def verifier_dir(tmp_path_factory, tokenizer) -> Path:
    return save(tiny_gemma(seed=1), tokenizer, tmp_path_factory.mktemp("verifier"))


@pytest.fixture(scope="session")
def draft_dir(tmp_path_factory, tokenizer) -> Path:
    """A smaller drafter whose embedding matrix is padded past the tokenizer's size."""
    model = tiny_gemma(seed=2, layers=2, vocab_size=len(SPECIALS) + VOCAB_WORDS + 8)
    return save(model, tokenizer, tmp_path_factory.mktemp("draft"))


@pytest.fixture(scope="session")
def verifier(verifier_dir) -> LoadedModel:
    return LoadedModel.load(str(verifier_dir), dtype="float32")
