"""Drafters: what proposes tokens for the verifier to check.

The public constructors take objects and check that the drafter's tokens mean the verifier's:

    PromptLookup(min_n=1, max_n=3)
    NGram(ngram_model, verifier, context=True, min_prob=0.2)   # ngram_model = polyspec.ngram.load(path)
    DraftModel(draft_model, verifier) / DraftModel.load("path-or-hub-id", verifier)

`verifier` is anything that carries the verifier's tokenizer and output width: a
`polyspec.Engine`, a `polyspec.models.LoadedModel`, or a tokenizer itself (its length is then
the width of draft distributions). A drafter is stateful while it drafts one sequence and
starts afresh with every sequence, so one object serves many calls, one at a time.
Spec strings ('ngram:yor.ngram+context') are parsed at the edge, by `polyspec.specs` and
`polyspec.Engine`.
"""

from __future__ import annotations

from polyspec.drafters.base import Drafter, NoDrafter
from polyspec.drafters.model import ModelDrafter
from polyspec.drafters.ngram import NGramDrafter, NGramOptions
from polyspec.drafters.prompt_lookup import PromptLookupDrafter
from polyspec.errors import UserError

__all__ = [
    "DraftModel",
    "Drafter",
    "ModelDrafter",
    "NGram",
    "NGramDrafter",
    "NGramOptions",
    "NoDrafter",
    "PromptLookup",
    "PromptLookupDrafter",
    "tokenizer_of",
    "vocab_size_of",
]


def tokenizer_of(verifier):
    """The tokenizer of a verifier-like object (an Engine, a LoadedModel), or the object itself."""
    return getattr(verifier, "tokenizer", verifier)


def vocab_size_of(verifier) -> int:
    """The width of the verifier's logits rows (a tokenizer alone: its length)."""
    size = getattr(verifier, "vocab_size", None)
    if isinstance(size, int) and hasattr(verifier, "tokenizer"):
        return size
    return len(verifier)


def _name_of(verifier) -> str:
    return str(getattr(verifier, "name", None) or getattr(tokenizer_of(verifier), "name_or_path", "") or "verifier")


class PromptLookup(PromptLookupDrafter):
    """Prompt lookup: copies what followed the latest earlier match of the context's last
    min_n..max_n tokens. Needs no verifier."""

    def __init__(self, min_n: int = 1, max_n: int = 3) -> None:
        super().__init__(min_n, max_n)


class NGram(NGramDrafter):
    """An n-gram drafter over a loaded n-gram model (`polyspec.ngram.load(path)`).

    context: also count the sequence's own n-grams (the spec's `+context`); backoff: use the
    longest seen suffix of the context (False: only the full context, as the study's model);
    min_prob: end a draft when the best next token is less likely than this; context_order:
    order of the sequence's own n-grams. Raises UserError when the model counts another
    tokenizer's tokens than the verifier's.
    """

    def __init__(
        self,
        model,
        verifier,
        *,
        context: bool = False,
        backoff: bool = True,
        min_prob: float = 0.0,
        context_order: int = 4,
    ) -> None:
        from polyspec.vocabulary import require_same

        if not 0.0 <= min_prob <= 1.0:
            raise UserError(f"n-gram drafter min_prob must be in [0, 1], got {min_prob}")
        if not 2 <= context_order <= 8:
            raise UserError(f"n-gram drafter context_order must be between 2 and 8, got {context_order}")
        stored = getattr(model, "fingerprint", None)
        if stored is not None:
            require_same(stored, tokenizer_of(verifier), "the n-gram model", _name_of(verifier))
        super().__init__(model, vocab_size_of(verifier), NGramOptions(context, backoff, min_prob, context_order))


class DraftModel(ModelDrafter):
    """A smaller causal LM with the verifier's vocabulary, drafting greedily or by sampling
    exactly as the verifier is asked to.

    `draft` is a `LoadedModel` or a transformers model (then its tokenizer is `tokenizer`, by
    default the verifier's). Raises UserError when the vocabularies differ.
    """

    def __init__(self, draft, verifier, tokenizer=None) -> None:
        from polyspec.models import LoadedModel
        from polyspec.vocabulary import fingerprint, require_same

        if not isinstance(draft, LoadedModel):
            tokenizer = tokenizer if tokenizer is not None else tokenizer_of(verifier)
            name = getattr(draft, "name_or_path", "") or type(draft).__name__
            draft = LoadedModel(model=draft.eval(), tokenizer=tokenizer, name=name)
        require_same(
            fingerprint(draft.tokenizer), tokenizer_of(verifier), f"drafter {draft.name!r}", _name_of(verifier)
        )
        super().__init__(draft, vocab_size_of(verifier))
        self.draft = draft

    @classmethod
    def load(cls, name: str, verifier, dtype: str | None = None, device: str | None = None) -> DraftModel:
        """Load the draft LM from a local path or hub id, by default in the verifier's dtype and
        on its device."""
        from polyspec.models import LoadedModel

        model = getattr(verifier, "model", None)
        parameter = next(model.parameters()) if model is not None else None
        if dtype is None:
            dtype = _dtype_name(parameter.dtype) if parameter is not None else "auto"
        if device is None:
            device = str(parameter.device) if parameter is not None else "cpu"
        return cls(LoadedModel.load(name, dtype=dtype, device=device), verifier)


def _dtype_name(dtype) -> str:
    from polyspec.models import DTYPES

    return next((name for name, value in DTYPES.items() if value == dtype), "auto")
