"""The part of a `suffix:PATH[+context]` drafter spec after the colon, turned into a drafter."""

from __future__ import annotations

from polyspec.errors import UserError
from polyspec.suffix.drafter import SuffixDrafter, SuffixOptions

GRAMMAR = "suffix:PATH[+context]"
_CONTEXT_SUFFIX = "+context"


def parse_suffix(argument: str) -> tuple[str, SuffixOptions]:
    """(index path, options) from 'PATH' or 'PATH+context'."""
    use_context = argument.endswith(_CONTEXT_SUFFIX)
    path = argument[: -len(_CONTEXT_SUFFIX)] if use_context else argument
    if not path:
        raise UserError(f"drafter 'suffix' needs an index file: {GRAMMAR}")
    return path, SuffixOptions(use_context=use_context)


def make_suffix_drafter(argument: str, verifier) -> SuffixDrafter:
    """Load the index and check that it holds the verifier's token ids."""
    from polyspec.suffix.storage import load
    from polyspec.vocabulary import require_same

    path, options = parse_suffix(argument)
    index = load(path)
    require_same(index.fingerprint, verifier.tokenizer, f"suffix index {path!r}", verifier.name)
    return SuffixDrafter(index, verifier.vocab_size, options)
