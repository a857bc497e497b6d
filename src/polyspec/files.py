"""Writing files so that a reader never sees half of one (the only atomic write and the only
append-only log in polyspec), and mapping them read-only.

Everything is written to a temporary file beside the target, flushed to disk, and renamed over
it; an interrupted write leaves the old file (or none) and no temporary behind.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from polyspec.errors import UserError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path to write; on success it replaces `path` in one rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; the result should not be
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Replace `path` with `data` (text is written as UTF-8)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


def append_lines(path: str | os.PathLike, records: Iterable[dict]) -> None:
    """Append JSON records, one per line, in one fsynced write: an interruption can cut only
    the last line short, which `read_lines` skips and `drop_torn_line` removes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def drop_torn_line(path: str | os.PathLike) -> None:
    """Cut a last line without its newline off the file, so that what is appended next starts
    a line of its own."""
    data = Path(path).read_bytes()
    if data and not data.endswith(b"\n"):
        os.truncate(path, data.rfind(b"\n") + 1)


def read_lines(path: str | os.PathLike, kind: str) -> list[dict]:
    """Every complete record of a JSON-lines file; a last line an interruption cut short is
    skipped, a bad line before it is a one-line UserError naming the file as `kind`."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as exc:
        raise UserError(f"{kind} {str(path)!r} does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {kind} {str(path)!r}: {exc}") from exc
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break
            raise UserError(f"{path}:{number}: not a JSON record") from exc
    return records


def map_readonly(path: Path, kind: str) -> mmap.mmap:
    """The whole file mapped read-only; a missing, empty or unreadable file is a one-line
    UserError naming it as `kind` (e.g. "n-gram model")."""
    name = str(path)
    try:
        with path.open("rb") as handle:
            if path.stat().st_size == 0:
                raise UserError(f"{kind} {name!r} is empty")
            return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except IsADirectoryError as exc:
        raise UserError(f"{kind} {name!r} is a directory, not a file") from exc
    except FileNotFoundError as exc:
        raise UserError(f"{kind} {name!r} does not exist") from exc
    except OSError as exc:
        raise UserError(f"cannot read {kind} {name!r}: {exc.strerror or exc}") from exc
