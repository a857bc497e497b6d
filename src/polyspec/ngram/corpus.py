"""Reading training documents from corpus files, in batches, without loading a file whole.

A document is one line of plain text (without its line break), one JSONL record's text field,
or one TSV row's column. Files may be gzipped (name ending in .gz); a directory stands for the
corpus files under it (.txt, .text, .jsonl, .tsv, and those with .gz), in sorted order.
Files are read as blocks of bytes cut at the last line break, so progress can be reported in
bytes read (compressed bytes for .gz files) and decoding happens a block at a time.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from polyspec.errors import UserError

TEXT_SUFFIXES = (".txt", ".text")
JSONL_SUFFIXES = (".jsonl",)
TSV_SUFFIXES = (".tsv",)
_BLOCK_BYTES = 1 << 20


@dataclass(frozen=True)
class RecordFormat:
    text_field: str = "text"  # JSONL: the field holding the document
    column: str = "0"  # TSV: a 0-based column number, or a column name from the header line


def file_kind(path: Path) -> str:
    """'jsonl', 'tsv' or 'text', by name (a .gz ending is looked through)."""
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(TSV_SUFFIXES):
        return "tsv"
    return "text"


def _is_corpus_file(path: Path) -> bool:
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    return not path.name.startswith(".") and name.endswith(TEXT_SUFFIXES + JSONL_SUFFIXES + TSV_SUFFIXES)


def corpus_files(paths: list[Path]) -> list[Path]:
    """Expand directories; every path must exist and the result must not be empty."""
    if not paths:
        raise UserError("give at least one corpus file or directory")
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and _is_corpus_file(p))
            if not found:
                raise UserError(f"corpus directory {str(path)!r} holds no .txt, .jsonl or .tsv files")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise UserError(f"corpus {str(path)!r} does not exist")
    return files


def _blocks(path: Path, on_bytes: Callable[[int], None]) -> Iterator[tuple[int, list[bytes]]]:
    """(number of the first line, complete lines without their line breaks), a block at a time."""
    try:
        raw = path.open("rb")
    except OSError as exc:
        raise UserError(f"cannot read corpus {str(path)!r}: {exc.strerror or exc}") from exc
    with raw:
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if path.name.lower().endswith(".gz") else raw
        carry = b""
        line_number = 1
        position = 0
        while True:
            try:
                block = stream.read(_BLOCK_BYTES)
            except (OSError, EOFError, zlib.error) as exc:
                raise UserError(f"cannot read corpus {str(path)!r}: damaged gzip data ({exc})") from exc
            now = raw.tell()
            on_bytes(now - position)
            position = now
            if not block:
                break
            block = carry + block
            cut = block.rfind(b"\n")
            if cut < 0:
                carry = block
                continue
            carry = block[cut + 1 :]
            lines = block[:cut].split(b"\n")
            yield line_number, lines
            line_number += len(lines)
        if carry:
            yield line_number, [carry]


def _decode(lines: list[bytes], path: Path, first_line: int) -> list[str]:
    try:
        text = b"\n".join(lines).decode("utf-8")
    except UnicodeDecodeError:
        for offset, line in enumerate(lines):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(f"corpus {str(path)!r} line {first_line + offset} is not UTF-8 text") from exc
        raise
    if first_line == 1:
        text = text.removeprefix("\ufeff")
    return [line.removesuffix("\r") for line in text.split("\n")]


def read_documents(
    path: Path, record_format: RecordFormat, on_bytes: Callable[[int], None] = lambda n: None
) -> Iterator[list[str]]:
    """Batches of non-empty documents from one corpus file."""
    kind = file_kind(path)
    column: int | None = None
    for first_line, raw_lines in _blocks(path, on_bytes):
        lines = _decode(raw_lines, path, first_line)
        if kind == "text":
            documents = [line for line in lines if line]
        elif kind == "jsonl":
            documents = _jsonl_texts(lines, path, first_line, record_format.text_field)
        else:
            if column is None:
                column, lines, first_line = _tsv_column(lines, path, record_format.column, first_line)
            documents = _tsv_texts(lines, path, first_line, column)
        if documents:
            yield documents


def _jsonl_texts(lines: list[str], path: Path, first_line: int, field: str) -> list[str]:
    texts = []
    for offset, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise UserError(f"corpus {str(path)!r} line {first_line + offset} is not valid JSON") from exc
        if not isinstance(record, dict) or field not in record:
            raise UserError(f"corpus {str(path)!r} line {first_line + offset} has no field {field!r}")
        text = record[field]
        if not isinstance(text, str):
            raise UserError(f"corpus {str(path)!r} line {first_line + offset}: field {field!r} is not a string")
        if text:
            texts.append(text)
    return texts


def _tsv_column(lines: list[str], path: Path, column: str, first_line: int) -> tuple[int, list[str], int]:
    """A number selects a column of every row; a name is looked up in the header line, which is
    then skipped."""
    if column.isdigit():
        return int(column), lines, first_line
    header = lines[0].split("\t")
    if column not in header:
        raise UserError(f"corpus {str(path)!r} has no column {column!r} (header: {', '.join(header)})")
    return header.index(column), lines[1:], first_line + 1


def _tsv_texts(lines: list[str], path: Path, first_line: int, column: int) -> list[str]:
    texts = []
    for offset, line in enumerate(lines):
        if not line:
            continue
        cells = line.split("\t")
        if column >= len(cells):
            raise UserError(
                f"corpus {str(path)!r} line {first_line + offset} has {len(cells)} columns, no column {column}"
            )
        if cells[column]:
            texts.append(cells[column])
    return texts
