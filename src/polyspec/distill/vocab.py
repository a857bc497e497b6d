"""The reduced output vocabulary of a drafter: the most frequent tokens of some corpora.

A drafter that can emit only these ids has a head that costs V / |vocabulary| of the
verifier's, and its draft distribution is zero elsewhere, so rejection sampling stays exact.
Each corpus counts equally whatever its size (frequencies are averaged, not counts summed),
so a large English corpus given for the prompt language does not crowd out a small corpus of
the target language.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

# Encoding a whole corpus in one call needs a lot of memory for long texts; lines are batched.
BATCH_LINES = 256


def token_frequencies(tokenizer, lines: Iterable[str]) -> Counter:
    """Token counts of the lines, each encoded without special tokens."""
    counts: Counter = Counter()
    batch: list[str] = []

    def flush() -> None:
        if batch:
            for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
                counts.update(ids)
            batch.clear()

    for line in lines:
        if line.strip():
            batch.append(line)
        if len(batch) >= BATCH_LINES:
            flush()
    flush()
    return counts


def always_kept(tokenizer) -> list[int]:
    """Ids a drafter must be able to emit whatever its corpora: end of sequence and newline."""
    ids = {i for i in (tokenizer.eos_token_id, tokenizer.bos_token_id) if i is not None}
    ids.update(tokenizer("\n", add_special_tokens=False)["input_ids"])
    return sorted(ids)


def top_tokens(
    tokenizer, corpora: Sequence[Iterable[str]], size: int, vocab_size: int
) -> tuple[list[int], dict[str, int]]:
    """The `size` most frequent ids of the corpora (plus `always_kept`), sorted, and counts for
    the record. Fewer when the corpora have fewer distinct tokens. Ties go to the lower id."""
    if size < 1:
        raise ValueError("size must be >= 1")
    score = np.zeros(vocab_size, dtype=np.float64)
    distinct: set[int] = set()
    tokens = 0
    for lines in corpora:
        counts = token_frequencies(tokenizer, lines)
        total = sum(counts.values())
        tokens += total
        for token, count in counts.items():
            if 0 <= token < vocab_size:
                score[token] += count / total
                distinct.add(token)
    kept = set(always_kept(tokenizer))
    order = np.lexsort((np.arange(vocab_size), -score))  # by score descending, then id
    for token in order[: size + len(kept)]:
        if len(kept) >= size or score[token] <= 0:
            break
        kept.add(int(token))
    info = {"corpus_tokens": tokens, "distinct_tokens": len(distinct), "kept": len(kept)}
    return sorted(kept), info
