"""The one vocabulary fingerprint: what must match between the tokenizer a drafter or an n-gram
was made with and the verifier's tokenizer that uses it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import weakref
from dataclasses import dataclass

from polyspec.errors import UserError


@dataclass(frozen=True)
class Fingerprint:
    vocab_size: int
    vocab_sha256: str

    def describe(self) -> str:
        return f"{self.vocab_size} tokens, vocabulary hash {self.vocab_sha256[:12]}"


# Hashing a 262k-token vocabulary takes a noticeable fraction of a second: once per tokenizer.
_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def fingerprint(tokenizer) -> Fingerprint:
    try:
        return _cache[tokenizer]
    except (KeyError, TypeError):
        pass
    vocab = tokenizer.get_vocab()
    pairs = sorted((int(i), token) for token, i in vocab.items())
    digest = hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode("utf-8")).hexdigest()
    size = max(len(tokenizer), max((i for i, _ in pairs), default=-1) + 1)
    result = Fingerprint(vocab_size=size, vocab_sha256=digest)
    with contextlib.suppress(TypeError):
        _cache[tokenizer] = result
    return result


def require_same(stored: Fingerprint, tokenizer, what: str, verifier_name: str) -> None:
    """A clear error when `what` (a drafter, an n-gram file) was made with another vocabulary."""
    expected = fingerprint(tokenizer)
    if stored != expected:
        raise UserError(
            f"{what} was made with another tokenizer ({stored.describe()}) than the verifier "
            f"{verifier_name!r} uses ({expected.describe()})"
        )
