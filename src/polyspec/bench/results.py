"""The results file: JSON lines, appended one whole record at a time, so an interrupted run
leaves a valid file that `--resume` continues."""

from __future__ import annotations

from pathlib import Path

from polyspec.errors import UserError
from polyspec.files import append_lines, drop_torn_line, read_lines


def read_records(path: Path) -> list[dict]:
    """Every complete record; a last line cut short by an interruption is skipped."""
    return read_lines(path, "results file")


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
            drop_torn_line(self.path)  # first, so that every record read is one the file keeps
            self.records = read_records(self.path)

    def append(self, record: dict) -> None:
        append_lines(self.path, [record])
        self.records.append(record)
