"""The model file: safetensors round trip, memory-mapped load, metadata, verify, the old format,
and every kind of damage rejected clearly."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from fixtures import write_version1
from safetensors import safe_open

from polyspec.errors import UserError
from polyspec.ngram import load as load_model
from polyspec.ngram.counting import count_chunk
from polyspec.ngram.storage import FORMAT_VERSION, _check_shapes, convert, load, read_version1, save, verify
from polyspec.vocabulary import Fingerprint

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
    save(random_trie(3), FINGERPRINT, path, {"corpus": [{"file": "a.txt", "sha256": "cd" * 32}]})
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


def test_metadata_round_trip(tmp_path):
    metadata = {"corpus": [{"file": "x.jsonl.gz", "bytes": 12, "sha256": "0f" * 32}], "text_sha256": "1" * 64}
    path = tmp_path / "m.ngram"
    save(random_trie(2), FINGERPRINT, path, metadata)
    model = load_model(path)
    assert model.metadata == metadata
    assert model.fingerprint == FINGERPRINT
    save(random_trie(2), FINGERPRINT, path)
    assert load_model(path).metadata == {}


def test_the_file_is_plain_safetensors(model_file):
    """Any safetensors reader sees the arrays and the header fields."""
    stored = load(model_file)
    with safe_open(model_file, framework="numpy") as reader:
        info = reader.metadata()
        assert sorted(reader.keys()) == sorted(stored.arrays())
        for name, array in stored.arrays().items():
            assert np.array_equal(reader.get_tensor(name), array)
    assert info["format_version"] == str(FORMAT_VERSION)
    assert (info["order"], info["vocab_size"], info["vocab_sha256"]) == ("3", "262144", "ab" * 32)
    assert json.loads(info["metadata"])["corpus"][0]["file"] == "a.txt"


def test_load_maps_the_file_instead_of_reading_it(model_file):
    stored = load(model_file)
    for array in stored.arrays().values():
        assert not array.flags.owndata and not array.flags.writeable
        assert array.base is not None and not isinstance(array.base, bytes)  # a view on the mapping


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


def flip(data: bytes, position: int) -> bytes:
    return data[:position] + bytes([data[position] ^ 0x40]) + data[position + 1 :]


def header_length(path) -> int:
    return 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]


def test_flipped_data_byte_passes_load_and_fails_verify(model_file):
    assert verify(model_file).data_sha256 == load(model_file).data_sha256
    data = model_file.read_bytes()
    model_file.write_bytes(flip(data, (header_length(model_file) + len(data)) // 2))
    load(model_file)  # the cheap check does not read the data
    with pytest.raises(UserError, match="data checksum mismatch") as error:
        verify(model_file)
    assert "\n" not in str(error.value) and str(model_file) in str(error.value)


def test_every_header_byte_is_checked(model_file):
    """A damaged byte anywhere in the header (length, tensor table, metadata) fails the load."""
    original = model_file.read_bytes()
    end = header_length(model_file)
    for position in range(0, end, 7):
        message = damaged(model_file, lambda data, p=position: flip(original, p))
        assert "corrupt" in message or "truncated" in message or "not a polyspec" in message, message


def test_changed_header_value_fails_its_checksum(model_file):
    data = model_file.read_bytes()
    end = header_length(model_file)
    changed = data[:end].replace(b'"min_count":"1"', b'"min_count":"7"')
    assert changed != data[:end]
    assert "header checksum" in damaged(model_file, lambda _: changed + data[end:])


@pytest.mark.parametrize("keep", [0.999, 0.5, 0.01])
def test_truncated_file(model_file, keep):
    assert "truncated" in damaged(model_file, lambda data: data[: int(len(data) * keep)])


def test_trailing_bytes(model_file):
    assert "corrupt" in damaged(model_file, lambda data: data + b"\0" * 8)


def test_not_a_model(model_file, tmp_path):
    assert "not a polyspec n-gram model" in damaged(model_file, lambda data: b"hello world, plain text\n" * 3)
    from safetensors.numpy import save_file

    other = tmp_path / "weights.safetensors"
    save_file({"w": np.zeros(3, np.float32)}, str(other))
    with pytest.raises(UserError, match="not a polyspec n-gram model"):
        load(other)


def test_empty_file(model_file):
    assert "empty" in damaged(model_file, lambda data: b"")


def test_other_format_version(tmp_path, monkeypatch):
    monkeypatch.setattr("polyspec.ngram.storage.FORMAT_VERSION", FORMAT_VERSION + 1)
    path = tmp_path / "future.ngram"
    save(random_trie(2), FINGERPRINT, path)
    monkeypatch.undo()
    with pytest.raises(UserError, match=f"format version {FORMAT_VERSION + 1}"):
        load(path)


def test_consistent_but_wrong_arrays_rejected(tmp_path):
    """A file with a valid header whose offsets disagree with its levels."""
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


def test_overwrite_is_atomic(model_file, monkeypatch):
    """A save that fails midway leaves the previous file intact and no temporary behind."""
    before = model_file.read_bytes()

    def disk_full(descriptor):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("polyspec.files.os.fsync", disk_full)
    with pytest.raises(OSError):
        save(random_trie(2, seed=9), FINGERPRINT, model_file)
    assert model_file.read_bytes() == before
    assert os.listdir(model_file.parent) == ["model.ngram"]


def test_old_format_is_refused_with_the_convert_command(tmp_path):
    old = tmp_path / "old.ngram"
    write_version1(random_trie(3), FINGERPRINT, old)
    with pytest.raises(UserError) as error:
        load(old)
    message = str(error.value)
    assert "old format" in message and f"polyspec ngram convert {old} --out" in message and "\n" not in message


def test_convert_keeps_every_count(tmp_path):
    trie = random_trie(4, seed=5)
    trie.min_count = 3
    old, new = tmp_path / "old.ngram", tmp_path / "new.ngram"
    write_version1(trie, FINGERPRINT, old)
    assert read_version1(old).to_trie().to_dict() == trie.to_dict()
    converted = convert(old, new)
    verify(new)
    assert converted.to_trie().to_dict() == trie.to_dict()
    assert (converted.fingerprint, converted.min_count, converted.num_tokens) == (FINGERPRINT, 3, trie.num_tokens)
    assert converted.metadata["converted_from"]["format_version"] == 1
    old.write_bytes(flip(old.read_bytes(), 100))
    with pytest.raises(UserError, match="damaged"):
        convert(old, new)
