"""The shared file helpers: append-only JSON lines that survive an interruption, read-only maps."""

from __future__ import annotations

import pytest

from polyspec.errors import UserError
from polyspec.files import append_lines, drop_torn_line, map_readonly, read_lines


def test_a_torn_last_line_is_skipped_then_cut_so_appends_start_a_line(tmp_path):
    path = tmp_path / "log.jsonl"
    append_lines(path, [{"a": 1}, {"b": "ü"}])
    with path.open("a") as handle:
        handle.write('{"c": 3}')  # complete JSON, but the newline never came: not kept
    assert read_lines(path, "log") == [{"a": 1}, {"b": "ü"}, {"c": 3}]
    drop_torn_line(path)
    assert read_lines(path, "log") == [{"a": 1}, {"b": "ü"}]
    append_lines(path, [{"d": 4}])
    assert read_lines(path, "log") == [{"a": 1}, {"b": "ü"}, {"d": 4}]
    with path.open("a") as handle:
        handle.write('{"e": 5, "cut')
    assert read_lines(path, "log")[-1] == {"d": 4}


def test_a_bad_line_before_the_last_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    with pytest.raises(UserError, match=r"log.jsonl:2: not a JSON record"):
        read_lines(path, "log")
    with pytest.raises(UserError, match="results file .* does not exist"):
        read_lines(tmp_path / "absent.jsonl", "results file")


CANNOT_MAP = [("absent", "does not exist"), ("empty", "is empty"), ("dir", "directory")]


@pytest.mark.parametrize(("make", "message"), CANNOT_MAP)
def test_mapping_a_file_that_cannot_be_mapped_is_one_line(tmp_path, make, message):
    path = tmp_path / "x"
    if make == "empty":
        path.write_bytes(b"")
    elif make == "dir":
        path.mkdir()
    with pytest.raises(UserError, match=f"suffix index '.*x' .*{message}"):
        map_readonly(path, "suffix index")
    path = tmp_path / "y"
    path.write_bytes(b"abc")
    with map_readonly(path, "suffix index") as mapped:
        assert mapped[:] == b"abc"
