"""Where a benchmark drafter comes from, so that runs on different corpora never mix in a report.

Every record carries `drafter_source`:

  null                                   a drafter without a model file (prompt lookup, plain)
  {"model_file", "sha256", "trained_on"}  the model file, the SHA-256 of its bytes, and what it
                                         was trained on: for an n-gram, `text_sha256` (the hash of
                                         the documents it counted) with the corpus files and their
                                         hashes, or the distillation settings of an n-gram
                                         distilled from the verifier
  {"parts": {NAME: source, ...}}         a router over drafters (`adaptive`): each part's source

`polyspec ngram stats MODEL` shows the same source for an n-gram file (`ngram_source`).
`identity` is what two sources are compared by: the model files' hashes (an n-gram file holds
its training metadata, so equal bytes mean the same counts from the same text).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

_HASHES: dict[tuple[str, int, int], str] = {}


def shown(path: Path | str) -> str:
    """A path as records show it: under the polyspec home as `$POLYSPEC_HOME/...`, so that
    records from two machines read alike; other paths as given."""
    from polyspec.assets.store import home

    try:
        return "$POLYSPEC_HOME/" + Path(path).resolve().relative_to(home().resolve()).as_posix()
    except ValueError:
        return str(path)


def file_sha256(path: Path | str) -> str:
    """SHA-256 of a file's bytes, remembered per path, size and modification time."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _HASHES:
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
        _HASHES[key] = digest.hexdigest()
    return _HASHES[key]


def file_entry(path: Path | str) -> dict:
    """A corpus file as n-gram metadata records it (as `polyspec ngram train` does)."""
    path = Path(path)
    return {"file": str(path), "bytes": path.stat().st_size, "sha256": file_sha256(path)}


def trained_on(metadata: dict) -> dict:
    """The training text's fingerprint from an n-gram file's metadata."""
    rest = dict(metadata)
    out: dict = {"text_sha256": rest.pop("text_sha256", None)}
    corpus = rest.pop("corpus", None)
    if isinstance(corpus, list):
        corpus = [{**entry, "file": shown(entry["file"])} if "file" in entry else entry for entry in corpus]
    if "distilled_from" in rest:
        rest["distilled_from"] = shown(rest["distilled_from"])  # a verifier given by path
        settings = rest.get("settings")
        if isinstance(settings, str):
            with contextlib.suppress(ValueError):
                rest["settings"] = json.loads(settings)
        if corpus is not None:
            rest["corpus"] = corpus  # the real corpus mixed in
        out["distillation"] = rest
        return out
    out["corpus"] = corpus
    if rest:
        out["details"] = rest  # e.g. language, split, tokenizer, record format
    return out


def ngram_source(path: Path | str) -> dict:
    from polyspec.ngram.storage import load

    stored = load(Path(path))
    return {"model_file": shown(path), "sha256": file_sha256(path), "trained_on": trained_on(stored.metadata)}


def path_source(path: Path | str) -> dict | None:
    """A drafter read from a path: an n-gram file, another model file, or a model directory
    (its weight files hashed together); None for what is not on disk (a hub id)."""
    path = Path(path)
    if path.is_file():
        try:
            return ngram_source(path)
        except Exception:  # not an n-gram file: a suffix index or another model file
            return {"model_file": shown(path), "sha256": file_sha256(path), "trained_on": None}
    if path.is_dir():
        weights = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
        if not weights:
            return None
        digest = hashlib.sha256()
        for weight in weights:
            digest.update(f"{weight.name}\0{file_sha256(weight)}\0".encode())
        model_file = weights[0] if len(weights) == 1 else path
        sha = file_sha256(weights[0]) if len(weights) == 1 else digest.hexdigest()
        return {"model_file": shown(model_file), "sha256": sha, "trained_on": None}
    return None


def identity(source: dict | None):
    """What two sources are compared by (hashable); None for no model file."""
    if source is None:
        return None
    if "parts" in source:
        return tuple(sorted((name, identity(part)) for name, part in source["parts"].items()))
    return source.get("sha256")


def model_fingerprint(model, dtype: str) -> str:
    """A fingerprint of a model's weights: its config, dtype, and for every parameter its name,
    shape and up to 4,096 evenly spaced values (cheap for any size, and any retraining or other
    checkpoint changes it)."""
    import torch

    digest = hashlib.sha256()
    digest.update(model.config.to_json_string(use_diff=False).encode())
    digest.update(dtype.encode())
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            flat = parameter.detach().reshape(-1)
            step = max(1, flat.numel() // 4096)
            values = flat[::step][:4096].float().cpu().numpy()
            digest.update(f"{name}\0{tuple(parameter.shape)}\0".encode())
            digest.update(values.tobytes())
    return digest.hexdigest()
