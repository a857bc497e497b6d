"""A drafter on disk: a transformers checkpoint plus, for a reduced vocabulary, its head.

    DIR/config.json, model.safetensors, tokenizer files   the truncated model, stock layout
                                                          (loads with AutoModelForCausalLM)
    DIR/draft_head.safetensors                            reduced head: weight [K, hidden] and
                                                          kept_ids [K] (absent: full vocabulary)
    DIR/polyspec-drafter.json                             what it was built from and trained on

A directory is written under a temporary name and renamed into place when complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from polyspec.distill.build import attach_reduced_head, full_head_in_place, reduced_head
from polyspec.errors import UserError

META = "polyspec-drafter.json"
HEAD = "draft_head.safetensors"
FORMAT = 1

_vocab_hashes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def vocab_fingerprint(tokenizer) -> str:
    """sha256 of the token -> id table: two tokenizers that agree on it encode alike."""
    try:
        return _vocab_hashes[tokenizer]
    except (KeyError, TypeError):
        pass
    digest = hashlib.sha256(repr(sorted(tokenizer.get_vocab().items())).encode()).hexdigest()
    with contextlib.suppress(TypeError):
        _vocab_hashes[tokenizer] = digest
    return digest


@dataclass
class DrafterMeta:
    verifier: str  # name or path it was cut from
    layers: int
    verifier_layers: int
    vocab_size: int  # the verifier's
    vocab_sha256: str
    kept: int | None = None  # size of the reduced vocabulary, None for the full one
    vocab_sources: list[str] = field(default_factory=list)
    training: list[dict] = field(default_factory=list)  # one entry per `distill train` run
    format: int = FORMAT

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict) -> DrafterMeta:
        known = set(cls.__dataclass_fields__)
        return cls(**{key: value for key, value in data.items() if key in known})


@dataclass
class Drafter:
    model: nn.Module
    meta: DrafterMeta

    @property
    def kept_ids(self) -> torch.Tensor | None:
        head = reduced_head(self.model)
        return None if head is None else head.kept_ids


def is_drafter_dir(path: Path) -> bool:
    return (Path(path) / META).is_file()


def read_meta(path: Path) -> DrafterMeta:
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"drafter {str(path)!r} does not exist")
    try:
        data = json.loads((path / META).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(
            f"{str(path)!r} is not a distilled drafter (no {META}); use model:PATH for other models"
        ) from None
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {str(path / META)!r}: {exc}") from exc
    if data.get("format") != FORMAT:
        raise UserError(f"drafter {str(path)!r} has format {data.get('format')!r}, this version reads {FORMAT}")
    return DrafterMeta.from_dict(data)


def load_drafter(path: Path, dtype: torch.dtype, device: str = "cpu") -> Drafter:
    from safetensors.torch import load_file

    from polyspec.models import load_model

    path = Path(path)
    meta = read_meta(path)
    model = load_model(str(path), dtype, device)
    if (path / HEAD).is_file():
        try:
            tensors = load_file(str(path / HEAD), device="cpu")
            weight, kept_ids = tensors["weight"], tensors["kept_ids"]
        except (OSError, KeyError, ValueError) as exc:
            raise UserError(f"cannot read the reduced head {str(path / HEAD)!r}: {exc}") from exc
        attach_reduced_head(model, kept_ids, weight.to(device))
    return Drafter(model=model, meta=meta)


def save_drafter(model: nn.Module, tokenizer, meta: DrafterMeta, out: Path) -> Path:
    """Write the drafter to `out` (replacing a drafter already there), atomically."""
    from safetensors.torch import save_file

    out = Path(out)
    if out.exists() and not is_drafter_dir(out) and any(out.iterdir()):
        raise UserError(f"refusing to overwrite {str(out)!r}: it is not empty and holds no drafter")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with full_head_in_place(model):
            model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        head = reduced_head(model)
        if head is not None:
            weight = head.weight.detach().to("cpu").contiguous()
            save_file({"weight": weight, "kept_ids": head.kept_ids.to("cpu")}, str(tmp / HEAD))
        (tmp / META).write_text(json.dumps(meta.to_dict(), indent=2, ensure_ascii=False), encoding="utf-8")
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def replace_dir(new: Path, target: Path) -> None:
    """Move `new` to `target`; an existing `target` is swapped out first and then removed."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
    new.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def check_verifier(meta: DrafterMeta, verifier, where: str) -> None:
    """The drafter must speak the verifier's vocabulary, or its ids would mean other tokens."""
    if meta.vocab_sha256 != vocab_fingerprint(verifier.tokenizer):
        raise UserError(f"drafter {where!r} was built for another vocabulary than the verifier {verifier.name!r}")


def share_input_embeddings(drafter: nn.Module, verifier: nn.Module) -> bool:
    """Point the drafter's input embeddings at the verifier's when they are equal (training
    freezes them), so a drafter costs only its layers and head in memory."""
    mine, theirs = drafter.get_input_embeddings(), verifier.get_input_embeddings()
    if mine is None or theirs is None or mine.weight is theirs.weight:
        return mine is not None and mine.weight is theirs.weight
    a, b = mine.weight, theirs.weight
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device or not torch.equal(a, b):
        return False
    old = mine.weight
    mine.weight = theirs.weight
    # A head tied to the old matrix (the full one, possibly kept aside) follows it.
    heads = [drafter.get_output_embeddings(), drafter.__dict__.get("_polyspec_full_head")]
    for head in heads:
        if head is not None and getattr(head, "weight", None) is old:
            head.weight = theirs.weight
    return True
