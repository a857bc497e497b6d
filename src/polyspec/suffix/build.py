"""Building an index: documents -> batched tokenisation -> one token text -> suffix array -> file.

`build` takes a tokenizer object and an iterable of documents (strings); `build_files` reads
them from corpus files (`polyspec.ngram.corpus`: plain, JSONL, TSV, gzipped, directories) and
records each file's name, size and SHA-256 in the index's metadata. The whole token text and
the sorting's work arrays (about 40 bytes per token) must fit in memory.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from polyspec.errors import UserError
from polyspec.ngram.corpus import RecordFormat, corpus_files, read_documents
from polyspec.ngram.tokenize import BatchEncoder
from polyspec.ngram.train import check_output, file_sha256
from polyspec.suffix.array import SEPARATOR, suffix_array
from polyspec.suffix.storage import save
from polyspec.vocabulary import fingerprint

BATCH_DOCUMENTS = 4096  # documents handed to the tokenizer at once


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


@contextmanager
def _progress(enabled: bool, total_bytes: int | None) -> Iterator[Callable[..., None]]:
    """Yields update(nbytes=..., tokens=...): a rich bar on stderr while tokenising, or nothing."""
    if not enabled:
        yield lambda **_: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
    from rich.progress import TransferSpeedColumn as Speed

    tokens = TextColumn("{task.fields[tokens]:,} tokens")
    columns = [TextColumn("tokenising"), BarColumn(), DownloadColumn(), Speed(), tokens, TimeRemainingColumn()]
    columns = columns if total_bytes else [columns[0], tokens]
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("tokenise", total=total_bytes, tokens=0)
        seen = [0]

        def update(nbytes: int = 0, tokens: int = 0) -> None:
            seen[0] += tokens
            bar.update(task, advance=nbytes, tokens=seen[0])

        yield update


def _batches(documents: Iterable[str]) -> Iterator[list[str]]:
    if isinstance(documents, str | bytes):
        raise TypeError("documents must be an iterable of strings, not one string")
    iterator = iter(documents)
    while chunk := list(itertools.islice(iterator, BATCH_DOCUMENTS)):
        if not all(isinstance(d, str) for d in chunk):
            raise TypeError("documents must be strings (for corpus files use build_files)")
        if batch := [d for d in chunk if d]:
            yield batch


def _check(tokenizer, out: Path) -> None:
    if isinstance(tokenizer, str | os.PathLike):
        raise TypeError("building takes a tokenizer object; resolve a name with polyspec.specs.load_tokenizer")
    check_output(out)


def build(tokenizer, documents: Iterable[str], out, *, metadata: dict | None = None) -> BuildReport:
    """Index `documents` (strings, each one document; empty ones skipped) in `tokenizer`'s ids."""
    out = Path(out)
    _check(tokenizer, out)
    return _build(tokenizer, _batches(documents), out, metadata or {}, lambda **_: None)


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
    with _progress(show_progress, sum(s["bytes"] for s in sources)) as update:
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
