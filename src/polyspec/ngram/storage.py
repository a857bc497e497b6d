"""The n-gram model file: a safetensors file holding the trie's arrays, memory-mapped on load.

Tensors, 1-D, each in the narrowest unsigned type that holds its values: for every order n,
tokens_n (last token of each n-gram) and counts_n, and below the top order starts_n (where the
continuations of each n-gram begin in level n + 1). An n-gram costs at most 4 (token) + 4
(count) + 4 (offset) bytes, and 8 at the top order.

The header's metadata (safetensors' string dict): format and format_version, order, the
tokenizer fingerprint (vocab_size, vocab_sha256), documents, tokens, min_count, metadata (JSON:
where the counts come from, e.g. the corpus files and their SHA-256), data_sha256 (SHA-256 of the
tensors' bytes, in name order) and header_sha256 (SHA-256 of the tensors' names, dtypes and
shapes and of every other metadata entry).

`load` maps the file and checks only what is cheap: the header parses and matches its hash, the
tensors tile the data up to the end of the file, the levels agree in length. No data is read
until a query touches it, so opening a file costs the same at any size. `verify` reads all of
it against data_sha256. Files of the format before (version 1, starting b"PSNGRAM\\n") are
refused with the command that converts them (`convert`, which reads them with `read_version1`).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from polyspec.errors import UserError
from polyspec.files import atomic_path, map_readonly
from polyspec.ngram.trie import Level, Trie, child_starts, parents_from_starts
from polyspec.vocabulary import Fingerprint

FORMAT = "polyspec-ngram"
FORMAT_VERSION = 2
VERSION1_MAGIC = b"PSNGRAM\n"
_DTYPES = {"U8": np.uint8, "U16": np.uint16, "U32": np.uint32, "U64": np.uint64}
_DTYPE_NAMES = {np.dtype(dtype): name for name, dtype in _DTYPES.items()}


@dataclass
class StoredModel:
    """A model file's counts as offsets-based arrays (read-only views into the mapped file)."""

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
    metadata: dict = field(default_factory=dict)
    data_sha256: str = ""

    def ngram_counts(self) -> list[int]:
        return [len(t) for t in self.tokens]

    def arrays(self) -> dict[str, np.ndarray]:
        named = {f"tokens_{n + 1}": t for n, t in enumerate(self.tokens)}
        named.update({f"counts_{n + 1}": c for n, c in enumerate(self.counts)})
        named.update({f"starts_{n + 1}": s for n, s in enumerate(self.starts)})
        return named

    def to_trie(self) -> Trie:
        parents = [np.zeros(len(self.tokens[0]), np.int64), *map(parents_from_starts, self.starts)]
        levels = [
            Level(p, t.astype(np.uint32), c.astype(np.int64))
            for p, t, c in zip(parents, self.tokens, self.counts, strict=True)
        ]
        return Trie(self.fingerprint.vocab_size, levels, self.documents, self.num_tokens, self.min_count)


def _narrowest(values: np.ndarray) -> np.ndarray:
    top = int(values.max()) if len(values) else 0
    return values.astype(next(d for d in _DTYPES.values() if top <= np.iinfo(d).max))


def _arrays(trie: Trie) -> dict[str, np.ndarray]:
    arrays = {}
    for n, level in enumerate(trie.levels, start=1):
        arrays[f"tokens_{n}"] = _narrowest(level.tokens)
        arrays[f"counts_{n}"] = _narrowest(level.counts)
        if n < trie.order:
            arrays[f"starts_{n}"] = _narrowest(child_starts(trie.levels[n].parents, len(level)))
    return arrays


def _data_digest(arrays: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name in sorted(arrays):
        digest.update(memoryview(np.ascontiguousarray(arrays[name])).cast("B"))
    return digest.hexdigest()


def _header_digest(layout: dict[str, tuple[str, list[int]]], info: dict[str, str]) -> str:
    described = {"tensors": layout, "metadata": {k: v for k, v in info.items() if k != "header_sha256"}}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode("utf-8")).hexdigest()


def save(trie: Trie, fingerprint: Fingerprint, path: Path | str, metadata: dict | None = None) -> int:
    """Write atomically; `metadata` (JSON-serialisable) says where the counts come from. Returns
    the file size."""
    arrays = _arrays(trie)
    info = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "order": str(trie.order),
        "vocab_size": str(fingerprint.vocab_size),
        "vocab_sha256": fingerprint.vocab_sha256,
        "documents": str(trie.documents),
        "tokens": str(trie.num_tokens),
        "min_count": str(trie.min_count),
        "metadata": json.dumps(metadata or {}, sort_keys=True, default=str),
        "data_sha256": _data_digest(arrays),
    }
    info["header_sha256"] = _header_digest({n: (_DTYPE_NAMES[a.dtype], list(a.shape)) for n, a in arrays.items()}, info)
    with atomic_path(path) as temporary:
        save_file(arrays, str(temporary), metadata=info)
    return Path(path).stat().st_size


def _header(mapped: mmap.mmap, name: str) -> tuple[dict, dict[str, str], int]:
    """(tensor entries, metadata, where the data begins), checked against the header's hash."""
    if mapped[: len(VERSION1_MAGIC)] == VERSION1_MAGIC:
        raise UserError(
            f"n-gram model {name!r} is in the old format (version 1): convert it with "
            f"`polyspec ngram convert {name} --out NEW.ngram`, or train it again"
        )
    if len(mapped) < 9 or mapped[8:9] != b"{":
        raise UserError(f"{name!r} is not a polyspec n-gram model file")
    (length,) = struct.unpack_from("<Q", mapped)
    if 8 + length > len(mapped):
        raise UserError(f"n-gram model {name!r} is truncated")
    try:
        tensors = json.loads(mapped[8 : 8 + length])
        info = tensors.pop("__metadata__", {})
        if not isinstance(info, dict) or info.get("format") != FORMAT:
            raise UserError(f"{name!r} is not a polyspec n-gram model file")
        version = str(info.get("format_version"))
        if version.isdigit() and version != str(FORMAT_VERSION):
            raise UserError(f"n-gram model {name!r} has format version {version}; this polyspec reads {FORMAT_VERSION}")
        layout = {n: (str(t["dtype"]), [int(s) for s in t["shape"]]) for n, t in tensors.items()}
        intact = _header_digest(layout, info) == info.get("header_sha256")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"n-gram model {name!r} is corrupt (unreadable header)") from exc
    if not intact:
        raise UserError(f"n-gram model {name!r} is corrupt (header checksum mismatch)")
    return tensors, info, 8 + length


def _views(mapped: mmap.mmap, tensors: dict, begin: int, name: str) -> dict[str, np.ndarray]:
    """Each tensor as a read-only array on the mapped file; they must tile the data exactly."""
    arrays, end = {}, 0
    try:
        for array_name, entry in sorted(tensors.items(), key=lambda item: item[1]["data_offsets"]):
            dtype, (length,) = np.dtype(_DTYPES[entry["dtype"]]), entry["shape"]
            first, last = (int(x) for x in entry["data_offsets"])
            if first != end or last - first != dtype.itemsize * length:
                raise ValueError("tensors do not tile the data")
            end = last
            if begin + end <= len(mapped):
                arrays[array_name] = np.frombuffer(mapped, dtype=dtype, count=length, offset=begin + first)
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"n-gram model {name!r} is corrupt (inconsistent tensor offsets)") from exc
    if begin + end > len(mapped):
        raise UserError(f"n-gram model {name!r} is truncated ({len(mapped)} of {begin + end} bytes)")
    if begin + end < len(mapped):
        raise UserError(f"n-gram model {name!r} is corrupt ({len(mapped) - begin - end} unexpected trailing bytes)")
    return arrays


def load(path: Path | str) -> StoredModel:
    """Map a model file and check its header and shapes; every failure is a one-line UserError."""
    path = Path(path)
    mapped = map_readonly(path, "n-gram model")
    tensors, info, begin = _header(mapped, str(path))
    return _assemble(path, info, _views(mapped, tensors, begin, str(path)), len(mapped))


def _assemble(path: Path, header: dict, arrays: dict[str, np.ndarray], file_size: int) -> StoredModel:
    """The model from its header fields (the same names in both formats) and named arrays."""
    try:
        order = int(header["order"])
        stored = StoredModel(
            path=path,
            fingerprint=Fingerprint(int(header["vocab_size"]), str(header["vocab_sha256"])),
            order=order,
            documents=int(header["documents"]),
            num_tokens=int(header["tokens"]),
            min_count=int(header["min_count"]),
            tokens=[arrays.pop(f"tokens_{n}") for n in range(1, order + 1)],
            counts=[arrays.pop(f"counts_{n}") for n in range(1, order + 1)],
            starts=[arrays.pop(f"starts_{n}") for n in range(1, order)],
            file_size=file_size,
            metadata=json.loads(header.get("metadata", "{}")),
            data_sha256=header.get("data_sha256", ""),
        )
        if arrays or order < 1:
            raise ValueError("unexpected arrays")
    except (KeyError, ValueError, TypeError) as exc:
        raise UserError(f"n-gram model {str(path)!r} is corrupt (missing or unexpected arrays)") from exc
    _check_shapes(stored, str(path))
    return stored


def _check_shapes(stored: StoredModel, name: str) -> None:
    """What the header cannot promise: levels that agree (reads a few values of each array)."""
    for n in range(stored.order):
        if len(stored.counts[n]) != len(stored.tokens[n]):
            raise UserError(f"n-gram model {name!r} is corrupt (level {n + 1} arrays differ in length)")
        if n + 1 < stored.order:
            starts = stored.starts[n]
            if len(starts) != len(stored.tokens[n]) + 1 or (starts[0], starts[-1]) != (0, len(stored.tokens[n + 1])):
                raise UserError(f"n-gram model {name!r} is corrupt (level {n + 1} offsets do not match)")
    _check_tokens(stored, name, stored.tokens[:1])  # the unigrams index the vocabulary on load


def _check_tokens(stored: StoredModel, name: str, levels: list[np.ndarray]) -> None:
    top = max((int(t.max()) for t in levels if len(t)), default=-1)
    if top >= stored.fingerprint.vocab_size:
        raise UserError(f"n-gram model {name!r} is corrupt (token id {top} outside its vocabulary)")


def verify(path: Path | str) -> StoredModel:
    """Load, then read every byte of the data against the hash recorded when it was written."""
    stored = load(path)
    if _data_digest(stored.arrays()) != stored.data_sha256:
        raise UserError(f"n-gram model {str(path)!r} is corrupt (data checksum mismatch)")
    _check_tokens(stored, str(path), stored.tokens)
    return stored


def read_version1(path: Path | str) -> StoredModel:
    """A file of the format before this one (magic, version 1, JSON header, 8-byte aligned raw
    arrays, SHA-256 of it all), read whole and checked; for `convert`."""
    path, name = Path(path), str(path)
    with map_readonly(path, "n-gram model") as mapped:
        data = mapped[:]
    if data[:8] != VERSION1_MAGIC:
        raise UserError(f"{name!r} is not an n-gram model file of format version 1")
    version, length = struct.unpack_from("<II", data, 8)
    if version != 1 or len(data) < 48 + length or hashlib.sha256(data[:-32]).digest() != data[-32:]:
        raise UserError(f"n-gram model {name!r} (format version 1) is damaged: train it again")
    header, offset, arrays = json.loads(data[16 : 16 + length]), 16 + length, {}
    for array_name, dtype, count in header.pop("arrays"):
        arrays[array_name] = np.frombuffer(data, dtype=np.dtype(dtype), count=count, offset=offset)
        offset += -(-arrays[array_name].nbytes // 8) * 8
    return _assemble(path, header, arrays, len(data))


def convert(old: Path | str, out: Path | str) -> StoredModel:
    """Rewrite a format-version-1 file in this format (the same counts)."""
    stored = read_version1(old)
    save(stored.to_trie(), stored.fingerprint, out, {"converted_from": {"file": str(old), "format_version": 1}})
    return load(out)
