"""The model file: round trip, size per n-gram, and every kind of damage rejected clearly."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from polyspec.errors import UserError
from polyspec.ngram.counting import count_chunk
from polyspec.ngram.storage import FORMAT_VERSION, _check_shapes, load, save
from polyspec.ngram.tokenize import Fingerprint

FINGERPRINT = Fingerprint(vocab_size=262_144, vocab_sha256="ab" * 32)


def random_trie(order: int, seed: int = 0, vocab: int = 262_144, size: int = 5000):
    rng = np.random.default_rng(seed)
    alphabet = rng.choice(vocab, size=40, replace=False)
    tokens = rng.choice(alphabet, size=size).astype(np.uint32)
    lengths = np.full(size // 50, 50)
    return count_chunk(tokens, lengths, order, vocab)


@pytest.fixture()
def model_file(tmp_path):
    path = tmp_path / "model.ngram"
    save(random_trie(3), FINGERPRINT, path)
    return path


@pytest.mark.parametrize("order", [1, 2, 4, 8])
def test_round_trip(tmp_path, order):
    trie = random_trie(order, seed=order)
    trie.min_count = 2
    path = tmp_path / "m.ngram"
    size = save(trie, FINGERPRINT, path)
    stored = load(path)
    assert stored.file_size == size == path.stat().st_size
    assert stored.fingerprint == FINGERPRINT
    assert stored.order == order
    assert (stored.num_tokens, stored.documents, stored.min_count) == (trie.num_tokens, trie.documents, 2)
    assert stored.ngram_counts() == trie.ngram_counts()
    assert stored.to_trie().to_dict() == trie.to_dict()


def test_no_temporary_files_left(model_file):
    assert sorted(p.name for p in model_file.parent.iterdir()) == ["model.ngram"]


def test_at_most_12_bytes_per_ngram(tmp_path):
    for order in (2, 3, 4):
        trie = random_trie(order, size=50_000)
        size = save(trie, FINGERPRINT, tmp_path / "m.ngram")
        assert size / sum(trie.ngram_counts()) <= 12


def damaged(path, transform):
    path.write_bytes(transform(path.read_bytes()))
    with pytest.raises(UserError) as error:
        load(path)
    message = str(error.value)
    assert "\n" not in message and str(path) in message
    return message


def test_flipped_byte_fails_the_checksum(model_file):
    def flip(data: bytes) -> bytes:
        middle = len(data) // 2
        return data[:middle] + bytes([data[middle] ^ 0x40]) + data[middle + 1 :]

    assert "checksum" in damaged(model_file, flip)


@pytest.mark.parametrize("keep", [0.999, 0.5, 0.01])
def test_truncated_file(model_file, keep):
    assert "truncated" in damaged(model_file, lambda data: data[: int(len(data) * keep)])


def test_trailing_bytes(model_file):
    assert "corrupt" in damaged(model_file, lambda data: data + b"\0" * 8)


def test_not_a_model(model_file):
    assert "not a polyspec n-gram model" in damaged(model_file, lambda data: b"hello world, plain text\n" * 3)


def test_empty_file(model_file):
    assert "empty" in damaged(model_file, lambda data: b"")


def test_other_format_version(model_file):
    def bump(data: bytes) -> bytes:
        return data[:8] + struct.pack("<I", FORMAT_VERSION + 1) + data[12:]

    assert f"version {FORMAT_VERSION + 1}" in damaged(model_file, bump)


def test_unreadable_header(model_file):
    def break_header(data: bytes) -> bytes:
        return data[:16] + b"{not json" + data[25:]

    assert "corrupt" in damaged(model_file, break_header)


def test_consistent_but_wrong_arrays_rejected(tmp_path):
    """A file with a valid checksum whose offsets disagree with its levels."""
    path = tmp_path / "m.ngram"
    save(random_trie(2), FINGERPRINT, path)
    stored = load(path)
    stored.starts[0] = stored.starts[0][:-1]  # as if a level were cut short
    with pytest.raises(UserError, match="offsets"):
        _check_shapes(stored, str(path))


def test_missing_and_directory(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load(tmp_path / "nothing.ngram")
    with pytest.raises(UserError, match="directory"):
        load(tmp_path)


def test_save_into_missing_directory(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        save(random_trie(2), FINGERPRINT, tmp_path / "no" / "m.ngram")


def test_overwrite_is_atomic(model_file, monkeypatch):
    """A save that fails midway leaves the previous file intact and no temporary behind."""
    before = model_file.read_bytes()

    def disk_full(descriptor):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("polyspec.ngram.storage.os.fsync", disk_full)
    with pytest.raises(OSError):
        save(random_trie(2, seed=9), FINGERPRINT, model_file)
    assert model_file.read_bytes() == before
    assert os.listdir(model_file.parent) == ["model.ngram"]
