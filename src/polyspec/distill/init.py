"""`distill init`: the untrained drafter — the verifier's embeddings, first L layers, final norm
and head, the head optionally reduced to the most frequent tokens of some corpora."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from polyspec.distill.build import truncated_model, verifier_layers
from polyspec.distill.checkpoint import save_drafter
from polyspec.distill.vocab import top_tokens
from polyspec.drafters.distilled import DrafterMeta
from polyspec.drafters.reduced_head import attach_reduced_head
from polyspec.errors import UserError


@dataclass(frozen=True)
class VocabSource:
    """A corpus for choosing the reduced vocabulary: a text file or a language's corpus split."""

    label: str  # 'file:PATH' or 'language:CODE'
    lines: tuple[str, ...]


def file_source(path: Path) -> VocabSource:
    from polyspec.tasks import read_lines

    return VocabSource(f"file:{path}", tuple(read_lines(Path(path))))


def language_source(code: str) -> VocabSource:
    from polyspec.tasks import corpus_text

    return VocabSource(f"language:{code}", tuple(corpus_text(code)))


def init_drafter(
    verifier: str,
    layers: int,
    out: Path,
    vocab_top: int = 0,
    sources: Sequence[VocabSource] = (),
    dtype: torch.dtype = torch.float32,
) -> tuple[Path, DrafterMeta]:
    """`verifier` is a name as the command line takes it (an embedded asset, a path, a hub id)."""
    from polyspec.specs import load_tokenizer, model_path
    from polyspec.vocabulary import fingerprint

    if vocab_top < 0:
        raise UserError(f"--vocab-top must be >= 0, got {vocab_top}")
    if vocab_top and not sources:
        raise UserError("--vocab-top needs corpora to count tokens in: --vocab-corpus FILE or --vocab-language CODE")
    if sources and not vocab_top:
        raise UserError("vocabulary corpora given without --vocab-top")
    path = model_path(verifier)
    tokenizer = load_tokenizer(verifier)
    model = truncated_model(path, layers, dtype)
    vocab = model.get_output_embeddings().weight.shape[0]
    kept = None
    if vocab_top:
        kept, _ = top_tokens(tokenizer, [source.lines for source in sources], vocab_top, vocab)
        attach_reduced_head(model, kept)
    meta = DrafterMeta(
        verifier=verifier,
        layers=layers,
        verifier_layers=verifier_layers(path),
        vocab_size=vocab,
        vocab_sha256=fingerprint(tokenizer).vocab_sha256,
        kept=len(kept) if kept is not None else None,
        vocab_sources=[source.label for source in sources],
    )
    return save_drafter(model, tokenizer, meta, out), meta
