"""Building an index: documents -> batched tokenisation -> one token text -> suffix array -> file.

`build` takes a tokenizer object and an iterable of documents (strings); `build_files` reads
them from corpus files (`polyspec.ngram.corpus`: plain, JSONL, TSV, gzipped, directories) and
records each file's name, size and SHA-256 in the index's metadata. The whole token text and
the sorting's work arrays (about 40 bytes per token) must fit in memory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from polyspec.errors import UserError
from polyspec.ngram.corpus import RecordFormat, corpus_files, read_documents
from polyspec.ngram.tokenize import BatchEncoder
from polyspec.ngram.train import check_output, document_batches, file_sha256, progress_bar
from polyspec.suffix.array import SEPARATOR, suffix_array
from polyspec.suffix.storage import save
from polyspec.vocabulary import fingerprint


@dataclass
class BuildReport:
    out: str
    documents: int
    tokens: int
    file_size: int
    seconds: float
    tokenize_seconds: float
    sort_seconds: float  # building the suffix array
    metadata: dict

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def token_text(arrays: list[np.ndarray], lengths: list[np.ndarray]) -> np.ndarray:
    """Documents' token ids (concatenated arrays, with each document's length) as one uint32
    text with SEPARATOR after every document."""
    tokens = np.concatenate(arrays) if arrays else np.zeros(0, np.uint32)
    sizes = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    text = np.full(len(tokens) + len(sizes), SEPARATOR, dtype=np.uint32)
    keep = np.ones(len(text), dtype=bool)
    keep[np.cumsum(sizes + 1) - 1] = False
    text[keep] = tokens
    return text


def _check(tokenizer, out: Path) -> None:
    if isinstance(tokenizer, str | os.PathLike):
        raise TypeError("building takes a tokenizer object; resolve a name with polyspec.specs.load_tokenizer")
    check_output(out)


def build(tokenizer, documents: Iterable[str], out, *, metadata: dict | None = None) -> BuildReport:
    """Index `documents` (strings, each one document; empty ones skipped) in `tokenizer`'s ids."""
    out = Path(out)
    _check(tokenizer, out)
    return _build(tokenizer, document_batches(documents), out, metadata or {}, lambda **_: None)


def build_files(
    tokenizer,
    paths: Iterable,
    out,
    *,
    record_format: RecordFormat = RecordFormat(),
    show_progress: bool = True,
    metadata: dict | None = None,
) -> BuildReport:
    """`build` on the documents of corpus files; the metadata records the files."""
    out = Path(out)
    _check(tokenizer, out)
    files = corpus_files([Path(p) for p in paths])
    sources = [{"file": str(p), "bytes": p.stat().st_size, "sha256": file_sha256(p)} for p in files]
    described = {"corpus": sources, "record_format": dict(record_format.__dict__), **(metadata or {})}
    with progress_bar(show_progress, sum(s["bytes"] for s in sources), "tokenising") as update:
        batches = (batch for path in files for batch in read_documents(path, record_format, lambda n: update(nbytes=n)))
        return _build(tokenizer, batches, out, described, update)


def _build(tokenizer, batches, out: Path, metadata: dict, update) -> BuildReport:
    began = time.perf_counter()
    vocabulary = fingerprint(tokenizer)
    if vocabulary.vocab_size >= SEPARATOR:
        raise UserError(f"a vocabulary of {vocabulary.vocab_size} tokens is too large for a suffix index")
    encoder = BatchEncoder(tokenizer)
    arrays, lengths = [], []
    tokenize_seconds = 0.0
    for documents in batches:
        t0 = time.perf_counter()
        tokens, sizes = encoder.encode(documents)
        tokenize_seconds += time.perf_counter() - t0
        arrays.append(tokens)
        lengths.append(sizes)
        update(tokens=len(tokens))
    text = token_text(arrays, lengths)
    del arrays, lengths
    if len(text) == 0 or not (text != SEPARATOR).any():
        raise UserError("the corpus holds no text: nothing to index")
    t0 = time.perf_counter()
    order = suffix_array(text)
    sort_seconds = time.perf_counter() - t0
    file_size = save(text, order, vocabulary, out, metadata)
    return BuildReport(
        out=str(out),
        documents=len(text) - len(order),
        tokens=len(order),
        file_size=file_size,
        seconds=time.perf_counter() - began,
        tokenize_seconds=tokenize_seconds,
        sort_seconds=sort_seconds,
        metadata=metadata,
    )
