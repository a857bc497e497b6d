"""Writing a drafter to disk (the layout, reading and loading are `polyspec.drafters.distilled`'s).

A directory is written under a temporary name and renamed into place when complete.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from torch import nn

from polyspec.drafters.distilled import HEAD, META, DrafterMeta
from polyspec.drafters.reduced_head import full_head_in_place, reduced_head
from polyspec.errors import UserError


def is_drafter_dir(path: Path) -> bool:
    return (Path(path) / META).is_file()


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
