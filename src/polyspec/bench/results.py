"""The results file: JSON lines, appended one whole record at a time, so an interrupted run
leaves a valid file that `--resume` continues."""

from __future__ import annotations

import json
import os
from pathlib import Path

from polyspec.errors import UserError


def read_records(path: Path) -> list[dict]:
    """Every complete record; a last line cut short by an interruption is skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as exc:
        raise UserError(f"results file {str(path)!r} does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read results file {str(path)!r}: {exc}") from exc
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


class ResultsLog:
    """Appends records to `path`, fsynced, each a single write of one line."""

    def __init__(self, path: Path, resume: bool) -> None:
        self.path = Path(path)
        self.records: list[dict] = []
        if self.path.exists() and self.path.stat().st_size:
            if not resume:
                raise UserError(
                    f"{self.path} already holds results: add --resume to continue it, or choose another --out"
                )
            self.records = read_records(self.path)
            self._drop_partial_last_line()
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _drop_partial_last_line(self) -> None:
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            with open(self.path, "r+b") as handle:
                handle.truncate(cut)

    def append(self, record: dict) -> None:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.records.append(record)
