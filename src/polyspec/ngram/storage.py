"""The n-gram model file: one versioned, checksummed file holding the whole trie.

Layout (little endian):
  magic      8 bytes   b"PSNGRAM\\n"
  version    uint32    FORMAT_VERSION
  header     uint32 length, then UTF-8 JSON padded to 8 bytes: order, tokenizer fingerprint
             (vocab_size, vocab_sha256), documents, tokens, min_count, and the arrays' names,
             dtypes and lengths in file order
  arrays     raw, each padded to 8 bytes; for every order n: tokens_n, counts_n and (below the
             top order) starts_n, the offsets of each n-gram's continuations in level n + 1
  checksum   sha256 of everything before it (32 bytes)

Each array takes the narrowest unsigned type that holds its values, so an n-gram costs
at most 4 (token) + 4 (count) + 4 (offset) bytes, and 8 at the top order.
Files are written to a temporary name in the same directory and renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from polyspec.errors import UserError
from polyspec.ngram.tokenize import Fingerprint
from polyspec.ngram.trie import Level, Trie, child_starts, parents_from_starts

MAGIC = b"PSNGRAM\n"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sII")  # magic, version, header length
_DIGEST_SIZE = 32
_ALIGN = 8


@dataclass
class StoredModel:
    """A loaded model file: counts as offsets-based arrays, ready for queries (read-only views
    into the file's bytes)."""

    path: Path
    fingerprint: Fingerprint
    order: int
    documents: int
    num_tokens: int
    min_count: int
    tokens: list[np.ndarray]  # [order] arrays: last token of each n-gram
    counts: list[np.ndarray]  # [order] arrays
    starts: list[np.ndarray]  # [order - 1] arrays: continuation offsets into the next level
    file_size: int

    def ngram_counts(self) -> list[int]:
        return [len(t) for t in self.tokens]

    def to_trie(self) -> Trie:
        levels = [
            Level(
                np.zeros(len(self.tokens[0]), np.int64),
                self.tokens[0].astype(np.uint32),
                self.counts[0].astype(np.int64),
            )
        ]
        for n in range(1, self.order):
            levels.append(
                Level(
                    parents_from_starts(self.starts[n - 1]),
                    self.tokens[n].astype(np.uint32),
                    self.counts[n].astype(np.int64),
                )
            )
        return Trie(
            vocab_size=self.fingerprint.vocab_size,
            levels=levels,
            documents=self.documents,
            num_tokens=self.num_tokens,
            min_count=self.min_count,
        )


def _narrowest(values: np.ndarray) -> np.ndarray:
    top = int(values.max()) if len(values) else 0
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if top <= np.iinfo(dtype).max:
            return values.astype(dtype)
    raise ValueError("value out of range")


def _arrays(trie: Trie) -> list[tuple[str, np.ndarray]]:
    arrays = []
    for n, level in enumerate(trie.levels, start=1):
        arrays.append((f"tokens_{n}", _narrowest(level.tokens)))
        arrays.append((f"counts_{n}", _narrowest(level.counts)))
        if n < trie.order:
            arrays.append((f"starts_{n}", _narrowest(child_starts(trie.levels[n].parents, len(level)))))
    return arrays


def _pad(size: int) -> int:
    return -size % _ALIGN


def save(trie: Trie, fingerprint: Fingerprint, path: Path) -> int:
    """Write atomically; returns the file size."""
    path = Path(path)
    arrays = _arrays(trie)
    header = {
        "order": trie.order,
        "vocab_size": fingerprint.vocab_size,
        "vocab_sha256": fingerprint.vocab_sha256,
        "documents": trie.documents,
        "tokens": trie.num_tokens,
        "min_count": trie.min_count,
        "arrays": [[name, array.dtype.str, len(array)] for name, array in arrays],
    }
    header_bytes = json.dumps(header).encode("utf-8")
    header_bytes += b" " * _pad(_PREFIX.size + len(header_bytes))
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise UserError(f"output directory {str(directory)!r} does not exist")
    digest = hashlib.sha256()
    descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:

            def write(data: bytes | memoryview) -> None:
                digest.update(data)
                handle.write(data)

            write(_PREFIX.pack(MAGIC, FORMAT_VERSION, len(header_bytes)))
            write(header_bytes)
            for _, array in arrays:
                write(memoryview(np.ascontiguousarray(array)).cast("B"))
                write(b"\0" * _pad(array.nbytes))
            handle.write(digest.digest())
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates the file private; give it the permissions a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path.stat().st_size


def load(path: Path | str) -> StoredModel:
    """Read and verify a model file; every failure is a one-line UserError."""
    path = Path(path)
    name = str(path)
    try:
        data = path.read_bytes()
    except IsADirectoryError as exc:
        raise UserError(f"n-gram model {name!r} is a directory, not a model file") from exc
    except FileNotFoundError as exc:
        raise UserError(f"n-gram model {name!r} does not exist") from exc
    except OSError as exc:
        raise UserError(f"cannot read n-gram model {name!r}: {exc.strerror or exc}") from exc
    if not data:
        raise UserError(f"n-gram model {name!r} is empty")
    if data[: len(MAGIC)] != MAGIC[: len(data)]:
        raise UserError(f"{name!r} is not a polyspec n-gram model file")
    if len(data) < _PREFIX.size:
        raise UserError(f"n-gram model {name!r} is truncated")
    _, version, header_length = _PREFIX.unpack_from(data)
    if version != FORMAT_VERSION:
        raise UserError(
            f"n-gram model {name!r} has format version {version}; this polyspec reads version {FORMAT_VERSION}"
        )
    offset = _PREFIX.size + header_length
    if len(data) < offset + _DIGEST_SIZE:
        raise UserError(f"n-gram model {name!r} is truncated")
    try:
        header = json.loads(data[_PREFIX.size : offset])
        layout = [(str(n), np.dtype(d), int(length)) for n, d, length in header["arrays"]]
        order = int(header["order"])
        if order < 1 or any(dtype.kind != "u" for _, dtype, _ in layout):
            raise ValueError("bad layout")
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"n-gram model {name!r} is corrupt (unreadable header)") from exc
    expected = offset + sum(dtype.itemsize * length + _pad(dtype.itemsize * length) for _, dtype, length in layout)
    expected += _DIGEST_SIZE
    if len(data) < expected:
        raise UserError(f"n-gram model {name!r} is truncated ({len(data)} of {expected} bytes)")
    if len(data) > expected:
        raise UserError(f"n-gram model {name!r} is corrupt ({len(data) - expected} unexpected trailing bytes)")
    if hashlib.sha256(memoryview(data)[:-_DIGEST_SIZE]).digest() != data[-_DIGEST_SIZE:]:
        raise UserError(f"n-gram model {name!r} is corrupt (checksum mismatch)")
    arrays: dict[str, np.ndarray] = {}
    for array_name, dtype, length in layout:
        arrays[array_name] = np.frombuffer(data, dtype=dtype, count=length, offset=offset)
        offset += dtype.itemsize * length + _pad(dtype.itemsize * length)
    try:
        stored = StoredModel(
            path=path,
            fingerprint=Fingerprint(int(header["vocab_size"]), str(header["vocab_sha256"])),
            order=order,
            documents=int(header["documents"]),
            num_tokens=int(header["tokens"]),
            min_count=int(header["min_count"]),
            tokens=[arrays[f"tokens_{n}"] for n in range(1, order + 1)],
            counts=[arrays[f"counts_{n}"] for n in range(1, order + 1)],
            starts=[arrays[f"starts_{n}"] for n in range(1, order)],
            file_size=len(data),
        )
    except (KeyError, ValueError, TypeError) as exc:
        raise UserError(f"n-gram model {name!r} is corrupt (missing arrays)") from exc
    _check_shapes(stored, name)
    return stored


def _check_shapes(stored: StoredModel, name: str) -> None:
    """The checksum catches damage; this catches a well-formed file whose arrays disagree."""
    for n in range(stored.order):
        if len(stored.counts[n]) != len(stored.tokens[n]):
            raise UserError(f"n-gram model {name!r} is corrupt (level {n + 1} arrays differ in length)")
        if n + 1 < stored.order:
            starts = stored.starts[n]
            if len(starts) != len(stored.tokens[n]) + 1 or int(starts[-1]) != len(stored.tokens[n + 1]):
                raise UserError(f"n-gram model {name!r} is corrupt (level {n + 1} offsets do not match)")
    top = max((int(t.max()) for t in stored.tokens if len(t)), default=-1)
    if top >= stored.fingerprint.vocab_size:
        raise UserError(f"n-gram model {name!r} is corrupt (token id {top} outside its vocabulary)")
