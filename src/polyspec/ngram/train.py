"""Training: documents -> batched tokenisation -> chunk counts -> merged counts -> model file.

`train` takes a tokenizer object and an iterable of documents (strings); `train_files` reads
them from corpus files and records which files (name, size, SHA-256) in the model's metadata.
Every model also records `text_sha256`, a hash of the documents it counted (each document's
UTF-8 bytes followed by a zero byte), however they were given.

Memory holds one chunk of tokens and the counts so far, never the corpus: counts of each chunk
are merged into the running total as the documents stream past.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from polyspec.errors import UserError
from polyspec.ngram import MAX_ORDER
from polyspec.ngram.corpus import RecordFormat, corpus_files, read_documents
from polyspec.ngram.counting import CHUNK_TOKENS, ChunkMerger, count_chunk
from polyspec.ngram.storage import save
from polyspec.ngram.tokenize import BatchEncoder, ChunkBuffer
from polyspec.ngram.trie import Trie, merge, prune, scaled
from polyspec.vocabulary import fingerprint

BATCH_DOCUMENTS = 4096  # documents handed to the tokenizer at once by `train`


@dataclass
class TrainReport:
    out: str
    order: int
    documents: int
    tokens: int
    ngrams: list[int]  # distinct n-grams per order, 1..order
    file_size: int
    seconds: float
    tokenize_seconds: float
    count_seconds: float
    metadata: dict  # as stored in the file

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def check_order(order: int) -> None:
    if not 1 <= order <= MAX_ORDER:
        raise UserError(f"order must be between 1 and {MAX_ORDER}, got {order}")


def check_output(out: Path) -> None:
    """Fail before a long run, not after it."""
    if out.is_dir():
        raise UserError(f"output {str(out)!r} is a directory")
    if not out.parent.is_dir():
        raise UserError(f"output directory {str(out.parent)!r} does not exist")


def _check(tokenizer, order: int, min_count: int, out: Path) -> None:
    if isinstance(tokenizer, str | os.PathLike):
        raise TypeError("training takes a tokenizer object; resolve a name with polyspec.specs.load_tokenizer")
    check_order(order)
    if min_count < 1:
        raise UserError(f"min count must be >= 1, got {min_count}")
    check_output(out)


@contextmanager
def progress_bar(enabled: bool, total_bytes: int | None, label: str = "counting") -> Iterator[Callable[..., None]]:
    """Yields update(nbytes=..., tokens=...): a rich bar on stderr, or nothing. Without a total
    (documents from an iterable) it shows tokens only. The suffix index builder shares it."""
    if not enabled:
        yield lambda **_: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
    from rich.progress import TransferSpeedColumn as Speed

    tokens = TextColumn("{task.fields[tokens]:,} tokens")
    columns = [TextColumn(label), BarColumn(), DownloadColumn(), Speed(), tokens, TimeRemainingColumn()]
    columns = columns if total_bytes else [columns[0], tokens]
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(label, total=total_bytes, tokens=0)
        state = {"tokens": 0}

        def update(nbytes: int = 0, tokens: int = 0) -> None:
            state["tokens"] += tokens
            progress.update(task, advance=nbytes, tokens=state["tokens"])

        yield update


def document_batches(documents: Iterable[str]) -> Iterator[list[str]]:
    """The non-empty documents of an iterable of strings, in batches for the tokenizer."""
    if isinstance(documents, str | bytes):
        raise TypeError("documents must be an iterable of strings, not one string")
    iterator = iter(documents)
    while chunk := list(itertools.islice(iterator, BATCH_DOCUMENTS)):
        if not all(isinstance(d, str) for d in chunk):
            raise TypeError("documents must be strings (corpus files are read by train_files and build_files)")
        if batch := [d for d in chunk if d]:
            yield batch


def train(
    tokenizer,
    documents: Iterable[str],
    order: int,
    out: Path | str,
    *,
    min_count: int = 1,
    show_progress: bool = True,
    metadata: dict | None = None,
    chunk_tokens: int = CHUNK_TOKENS,
    weight: int = 1,
    counted: Trie | None = None,
) -> TrainReport:
    """Count the n-grams of `documents` (an iterable of strings, each one document; empty ones
    are skipped) in `tokenizer`'s tokens and write them to `out`. `metadata` (JSON-serialisable)
    is stored in the file with the training text's hash. Each occurrence counts `weight` (>= 1)
    times; `counted` (counts of the same order and vocabulary made elsewhere) is added to them,
    and `min_count` applies to the sums."""
    out = Path(out)
    _check(tokenizer, order, min_count, out)
    if weight < 1:
        raise UserError(f"weight must be >= 1, got {weight}")
    batches = document_batches(documents)
    with progress_bar(show_progress, None) as update:
        return _train(tokenizer, batches, order, out, min_count, metadata, chunk_tokens, update, weight, counted)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def train_files(
    tokenizer,
    paths: Iterable[Path | str],
    order: int,
    out: Path | str,
    *,
    record_format: RecordFormat = RecordFormat(),
    min_count: int = 1,
    show_progress: bool = True,
    metadata: dict | None = None,
    chunk_tokens: int = CHUNK_TOKENS,
) -> TrainReport:
    """`train` on the documents of corpus files (`corpus.py`: plain, JSONL, TSV, gzipped,
    directories); the metadata records each file's name, size and SHA-256."""
    out = Path(out)
    _check(tokenizer, order, min_count, out)
    files = corpus_files([Path(p) for p in paths])
    sources = [{"file": str(p), "bytes": p.stat().st_size, "sha256": file_sha256(p)} for p in files]
    described = {"corpus": sources, "record_format": dict(record_format.__dict__), **(metadata or {})}
    with progress_bar(show_progress, sum(s["bytes"] for s in sources)) as update:
        batches = (
            batch
            for path in files
            for batch in read_documents(path, record_format, on_bytes=lambda n: update(nbytes=n))
        )
        return _train(tokenizer, batches, order, out, min_count, described, chunk_tokens, update)


def _train(
    tokenizer, batches, order, out, min_count, metadata, chunk_tokens, update, weight=1, counted=None
) -> TrainReport:
    began = time.perf_counter()
    vocabulary = fingerprint(tokenizer)
    encoder = BatchEncoder(tokenizer)
    merger = ChunkMerger(order, vocabulary.vocab_size)
    buffer = ChunkBuffer(chunk_tokens)
    text = hashlib.sha256()
    tokenize_seconds = count_seconds = 0.0

    def count_buffer() -> None:
        nonlocal count_seconds
        tokens, lengths = buffer.take()
        t0 = time.perf_counter()
        merger.add(count_chunk(tokens, lengths, order, vocabulary.vocab_size))
        count_seconds += time.perf_counter() - t0

    for documents in batches:
        text.update("\0".join(documents).encode("utf-8") + b"\0")
        t0 = time.perf_counter()
        tokens, lengths = encoder.encode(documents)
        tokenize_seconds += time.perf_counter() - t0
        buffer.add(tokens, lengths)
        update(tokens=len(tokens))
        if buffer.full:
            count_buffer()
    if len(buffer):
        count_buffer()
    t0 = time.perf_counter()
    trie = scaled(merger.result(), weight)
    if counted is not None:
        trie = merge(trie, counted)
    trie = prune(trie, min_count)
    count_seconds += time.perf_counter() - t0
    if trie.num_tokens == 0:
        raise UserError("the corpus holds no text: nothing to count")
    stored = {**(metadata or {}), "text_sha256": text.hexdigest()}
    file_size = save(trie, vocabulary, out, stored)
    return TrainReport(
        out=str(out),
        order=order,
        documents=trie.documents,
        tokens=trie.num_tokens,
        ngrams=trie.ngram_counts(),
        file_size=file_size,
        seconds=time.perf_counter() - began,
        tokenize_seconds=tokenize_seconds,
        count_seconds=count_seconds,
        metadata=stored,
    )
