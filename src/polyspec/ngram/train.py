"""Training: corpus files -> batched tokenisation -> chunk counts -> merged counts -> model file.

Memory holds one chunk of tokens and the counts so far, never the corpus: counts of each chunk
are merged into the running total as the corpus streams past.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from polyspec.errors import UserError
from polyspec.ngram import MAX_ORDER
from polyspec.ngram.corpus import RecordFormat, corpus_files, read_documents
from polyspec.ngram.counting import CHUNK_TOKENS, ChunkMerger, count_chunk
from polyspec.ngram.storage import save
from polyspec.ngram.tokenize import BatchEncoder, ChunkBuffer, tokenizer_fingerprint
from polyspec.ngram.trie import prune


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


@contextmanager
def _progress(enabled: bool, total_bytes: int) -> Iterator[Callable[..., None]]:
    """Yields update(nbytes=..., tokens=...): a rich bar on stderr, or nothing."""
    if not enabled:
        yield lambda **_: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (
        TextColumn("counting"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[tokens]:,} tokens"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("count", total=total_bytes, tokens=0)
        state = {"tokens": 0}

        def update(nbytes: int = 0, tokens: int = 0) -> None:
            state["tokens"] += tokens
            progress.update(task, advance=nbytes, tokens=state["tokens"])

        yield update


def train(
    tokenizer_name: str,
    corpus: list[Path],
    order: int,
    out: Path,
    min_count: int = 1,
    record_format: RecordFormat = RecordFormat(),
    show_progress: bool = True,
    chunk_tokens: int = CHUNK_TOKENS,
) -> TrainReport:
    check_order(order)
    if min_count < 1:
        raise UserError(f"min count must be >= 1, got {min_count}")
    out = Path(out)
    check_output(out)
    files = corpus_files(list(corpus))
    began = time.perf_counter()
    from polyspec.models import load_tokenizer  # imports torch: only once the arguments are known good

    tokenizer = load_tokenizer(tokenizer_name)
    fingerprint = tokenizer_fingerprint(tokenizer)
    encoder = BatchEncoder(tokenizer)
    merger = ChunkMerger(order, fingerprint.vocab_size)
    buffer = ChunkBuffer(chunk_tokens)
    tokenize_seconds = count_seconds = 0.0

    def count_buffer() -> None:
        nonlocal count_seconds
        tokens, lengths = buffer.take()
        t0 = time.perf_counter()
        merger.add(count_chunk(tokens, lengths, order, fingerprint.vocab_size))
        count_seconds += time.perf_counter() - t0

    total_bytes = sum(path.stat().st_size for path in files)
    with _progress(show_progress, total_bytes) as update:
        for path in files:
            for documents in read_documents(path, record_format, on_bytes=lambda n: update(nbytes=n)):
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
    trie = prune(merger.result(), min_count)
    count_seconds += time.perf_counter() - t0
    if trie.num_tokens == 0:
        raise UserError("the corpus holds no text: nothing to count")
    file_size = save(trie, fingerprint, out)
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
    )
