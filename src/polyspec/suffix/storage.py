"""The suffix index file: safetensors, memory-mapped on load.

Tensors: `text`, uint8 [n, 4], the documents' token ids as 4 big-endian bytes each (so that
byte order is token order) with the separator 0xFFFFFFFF after every document; `suffix_array`,
uint32 [n - documents], the suffixes that start with a token, sorted. Metadata (safetensors'
string dict): format, format_version, the tokenizer fingerprint (vocab_size, vocab_sha256),
tokens, documents, and metadata (JSON: the corpus files with their sizes and SHA-256).

Loading maps the file and checks what is cheap: the header, the shapes, the file's size. No
data is read until a query touches it, so opening an index costs the same at any size.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from polyspec.errors import UserError
from polyspec.files import atomic_path, map_readonly
from polyspec.suffix.index import SuffixIndex
from polyspec.vocabulary import Fingerprint

FORMAT = "polyspec-suffix"
FORMAT_VERSION = 1


def save(text: np.ndarray, suffix_array: np.ndarray, fingerprint: Fingerprint, path, metadata: dict) -> int:
    """Write the text (uint32 ids with separators) and its suffix array atomically; returns
    the file size."""
    documents = len(text) - len(suffix_array)
    info = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION),
        "vocab_size": str(fingerprint.vocab_size),
        "vocab_sha256": fingerprint.vocab_sha256,
        "tokens": str(len(suffix_array)),
        "documents": str(documents),
        "metadata": json.dumps(metadata, sort_keys=True, default=str),
    }
    arrays = {
        "text": text.astype(">u4").view(np.uint8).reshape(-1, 4),
        "suffix_array": np.ascontiguousarray(suffix_array, dtype=np.uint32),
    }
    with atomic_path(path) as temporary:
        save_file(arrays, str(temporary), metadata=info)
    return Path(path).stat().st_size


def load(path) -> SuffixIndex:
    """Map an index file and check its header; every failure is a one-line UserError."""
    path = Path(path)
    name = str(path)
    mapped = map_readonly(path, "suffix index")
    (length,) = struct.unpack_from("<Q", mapped) if len(mapped) >= 8 else (0,)
    if len(mapped) < 9 or mapped[8:9] != b"{" or 8 + length > len(mapped):
        raise UserError(f"{name!r} is not a polyspec suffix index file")
    try:
        tensors = json.loads(mapped[8 : 8 + length])
        info = tensors.pop("__metadata__", {})
    except ValueError as exc:
        raise UserError(f"{name!r} is not a polyspec suffix index file") from exc
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise UserError(f"{name!r} is not a polyspec suffix index file")
    if info.get("format_version") != str(FORMAT_VERSION):
        version = info.get("format_version")
        raise UserError(f"suffix index {name!r} has format version {version}; this polyspec reads {FORMAT_VERSION}")
    begin = 8 + length
    try:
        text, array = tensors["text"], tensors["suffix_array"]
        documents, tokens = int(info["documents"]), int(info["tokens"])
        shapes_agree = (
            text["dtype"] == "U8"
            and text["shape"] == [tokens + documents, 4]
            and array["dtype"] == "U32"
            and array["shape"] == [tokens]
            and set(tensors) == {"text", "suffix_array"}
        )
        if not shapes_agree:
            raise ValueError("unexpected tensors")
        end = begin + max(int(text["data_offsets"][1]), int(array["data_offsets"][1]))
        if end != len(mapped):
            raise UserError(f"suffix index {name!r} is truncated or damaged ({len(mapped)} of {end} bytes)")
        suffix_array = np.frombuffer(mapped, np.uint32, tokens, begin + int(array["data_offsets"][0]))
        fingerprint = Fingerprint(int(info["vocab_size"]), info["vocab_sha256"])
        metadata = json.loads(info.get("metadata", "{}"))
        start = begin + int(text["data_offsets"][0])
        index = SuffixIndex(mapped, start, suffix_array, fingerprint, documents, metadata)
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise UserError(f"suffix index {name!r} is corrupt (unexpected header)") from exc
    index.path, index.file_size = path, len(mapped)
    return index
