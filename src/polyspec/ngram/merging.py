"""Merging model files: counts add up; the files must share tokenizer and order."""

from __future__ import annotations

from pathlib import Path

from polyspec.errors import UserError
from polyspec.ngram.storage import StoredModel, load, save
from polyspec.ngram.train import check_output
from polyspec.ngram.trie import merge


def check_compatible(first: StoredModel, other: StoredModel) -> None:
    if other.fingerprint != first.fingerprint:
        raise UserError(
            f"cannot merge {str(other.path)!r} into {str(first.path)!r}: they were trained with different "
            f"tokenizers ({other.fingerprint.describe()} vs {first.fingerprint.describe()})"
        )
    if other.order != first.order:
        raise UserError(
            f"cannot merge {str(other.path)!r} (order {other.order}) with {str(first.path)!r} (order {first.order})"
        )


def merge_files(paths: list[Path], out: Path) -> StoredModel:
    """Adds the counts of every file and writes them to `out`, whose metadata lists each source
    (file, data hash, metadata); returns the merged model."""
    if len(paths) < 2:
        raise UserError("merge needs at least two model files")
    out = Path(out)
    check_output(out)
    models = [load(path) for path in paths]
    for other in models[1:]:
        check_compatible(models[0], other)
    total = models[0].to_trie()
    for other in models[1:]:
        total = merge(total, other.to_trie())
    sources = [{"file": str(m.path), "data_sha256": m.data_sha256, "metadata": m.metadata} for m in models]
    save(total, models[0].fingerprint, out, {"merged_from": sources})
    return load(out)
