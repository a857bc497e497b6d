"""Suffix arrays of token texts by prefix doubling, in vectorised numpy.

The text is documents of token ids, each followed by a separator. Every separator sorts above all
tokens and below the separators after it, as if each were a distinct symbol: a suffix ends, for
ordering, at its document's end, and suffixes that agree up to it are ordered by position. The
array holds the suffixes that start with a token (not those that start with a separator).

Prefix doubling (Manber-Myers) with the refinement of Larsson and Sadakane: after round h the
suffixes are sorted by their first h tokens, and each one's rank is where its group of equal
h-token prefixes begins; round 2h re-sorts only the groups of more than one suffix, by (rank of
the suffix, rank of the suffix h tokens later). Groups of one drop out, so rounds get cheaper as
they go, and no group outlives the longest repeat inside one document.
"""

from __future__ import annotations

import numpy as np

SEPARATOR = 0xFFFFFFFF  # the document separator in token texts; no vocabulary reaches it


def _runs(sorted_keys: np.ndarray) -> np.ndarray:
    """For each element of a sorted array, the index of the first element equal to it."""
    starts = np.ones(len(sorted_keys), dtype=bool)
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=starts[1:])
    return np.maximum.accumulate(np.where(starts, np.arange(len(sorted_keys)), 0))


def _unsettled(heads: np.ndarray) -> np.ndarray:
    """Where in `heads` (each element's group head, non-decreasing) groups hold more than one."""
    alone = np.ones(len(heads), dtype=bool)
    if len(heads) > 1:
        same = heads[1:] == heads[:-1]
        alone[1:] &= ~same
        alone[:-1] &= ~same
    return np.flatnonzero(~alone)


def suffix_array(text: np.ndarray) -> np.ndarray:
    """The suffix array (uint32) of `text`, a uint32 array of token ids with SEPARATOR after
    every document (the last element must be one)."""
    n = len(text)
    if n == 0:
        return np.zeros(0, np.uint32)
    if text[-1] != SEPARATOR:
        raise ValueError("a token text must end with a separator")
    if n >= 1 << 31:
        raise ValueError("token texts of 2**31 tokens and more are not supported")
    keys = text.astype(np.int64)
    ends = np.flatnonzero(text == SEPARATOR)
    keys[ends] = (1 << 32) + np.arange(len(ends))  # each separator a symbol of its own
    order = np.argsort(keys, kind="stable")
    heads = _runs(keys[order])
    rank = np.empty(n, np.int64)
    rank[order] = heads
    active = _unsettled(heads)
    span = n + 1
    h = 1
    while len(active):
        suffixes = order[active]
        combined = rank[suffixes] * span + rank[suffixes + h]
        resort = np.argsort(combined)
        suffixes, combined = suffixes[resort], combined[resort]
        order[active] = suffixes
        heads = active[_runs(combined)]
        rank[suffixes] = heads
        active = active[_unsettled(heads)]
        h *= 2
    real = n - len(ends)  # separators sort last: drop the suffixes that start with one
    return order[:real].astype(np.uint32)
