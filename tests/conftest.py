"""Pytest fixtures shared by the test modules, built from fixtures.py: the word-level tokenizer,
a tiny Gemma 3 verifier and a smaller drafter saved as model directories, the verifier loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fixtures import SPECIALS, VOCAB_WORDS, build_tokenizer, save, tiny_gemma

from polyspec.models import LoadedModel

# Tiny models gain nothing from a second thread, and tests share the machine.
torch.set_num_threads(1)


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
