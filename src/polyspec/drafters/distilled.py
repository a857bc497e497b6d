"""A drafter cut from the verifier (`polyspec distill init`), trained or not: 'distill:PATH'.

On disk, a transformers checkpoint plus, for a reduced vocabulary, its head:

    DIR/config.json, model.safetensors, tokenizer files   the truncated model, stock layout
                                                          (loads with AutoModelForCausalLM)
    DIR/draft_head.safetensors                            reduced head: weight [K, hidden] and
                                                          kept_ids [K] (absent: full vocabulary)
    DIR/polyspec-drafter.json                             what it was built from and trained on

It drafts exactly as the model drafter does (own cache, the verifier's logits processing when
sampling). A reduced-vocabulary head already returns full rows with -inf outside its kept ids,
so its draft distributions are zero there and rejection sampling stays exact. Input embeddings
equal to the verifier's are shared with it rather than held twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from polyspec.drafters.model import ModelDrafter
from polyspec.drafters.reduced_head import attach_reduced_head
from polyspec.errors import UserError
from polyspec.models import LoadedModel

META = "polyspec-drafter.json"
HEAD = "draft_head.safetensors"
FORMAT = 2  # 2: vocab_sha256 is `polyspec.vocabulary.fingerprint`'s


@dataclass
class DrafterMeta:
    verifier: str  # name or path it was cut from
    layers: int
    verifier_layers: int
    vocab_size: int  # the verifier's
    vocab_sha256: str  # polyspec.vocabulary.fingerprint(tokenizer).vocab_sha256
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


def read_meta(path: Path | str) -> DrafterMeta:
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
        raise UserError(
            f"drafter {str(path)!r} has format {data.get('format')!r}, this version reads {FORMAT}: "
            "re-run `polyspec distill init` (then `polyspec distill train`) to rebuild it"
        )
    return DrafterMeta.from_dict(data)


def check_verifier(meta: DrafterMeta, verifier: LoadedModel, where: str) -> None:
    """The drafter must speak the verifier's vocabulary, or its ids would mean other tokens."""
    from polyspec.vocabulary import fingerprint

    if meta.vocab_sha256 != fingerprint(verifier.tokenizer).vocab_sha256:
        raise UserError(f"drafter {where!r} was built for another vocabulary than the verifier {verifier.name!r}")


def load_drafter(path: Path | str, dtype: torch.dtype, device: str = "cpu") -> nn.Module:
    """The drafter's model, with its reduced head when it has one."""
    from safetensors.torch import load_file

    from polyspec.models import load_model

    path = Path(path)
    read_meta(path)
    model = load_model(str(path), dtype, device)
    if (path / HEAD).is_file():
        try:
            tensors = load_file(str(path / HEAD), device="cpu")
            weight, kept_ids = tensors["weight"], tensors["kept_ids"]
        except (OSError, KeyError, ValueError) as exc:
            raise UserError(f"cannot read the reduced head {str(path / HEAD)!r}: {exc}") from exc
        attach_reduced_head(model, kept_ids, weight.to(device))
    return model


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


def load_distilled(path: Path | str, verifier: LoadedModel) -> ModelDrafter:
    """The drafter in `path` for `verifier`, its input embeddings shared with the verifier's."""
    check_verifier(read_meta(path), verifier, str(path))
    model = load_drafter(path, next(verifier.model.parameters()).dtype, str(verifier.device))
    share_input_embeddings(model, verifier.model)
    return ModelDrafter(LoadedModel(model=model, tokenizer=verifier.tokenizer, name=str(path)), verifier.vocab_size)
