"""The import contract in pyproject.toml (docs/ARCHITECTURE.md) holds, and it can fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def lint_imports(source_root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(source_root)}
    command = [str(Path(sys.executable).with_name("lint-imports")), "--config", str(ROOT / "pyproject.toml")]
    code = f"import sys, runpy; sys.path.insert(0, {str(source_root)!r}); sys.argv = {command!r}; "
    code += "runpy.run_path(sys.argv[0], run_name='__main__')"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_layers_point_down_and_no_cycles():
    result = lint_imports(ROOT / "src")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_an_upward_import_breaks_the_contract(tmp_path):
    shutil.copytree(ROOT / "src" / "polyspec", tmp_path / "polyspec", ignore=shutil.ignore_patterns("__pycache__"))
    types = tmp_path / "polyspec" / "types.py"
    types.write_text(types.read_text() + "\n\ndef _upward():\n    from polyspec.bench import runner  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "polyspec.types -> polyspec.bench" in result.stdout, result.stdout[-3000:]
