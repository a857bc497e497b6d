"""Batched tokenisation of documents into flat uint32 arrays.

Documents are encoded without special tokens, in batches through the tokenizers library, which
spreads a batch over the cores. Ids are uint32: vocabularies here reach 262k tokens.
"""

from __future__ import annotations

import itertools

import numpy as np


class BatchEncoder:
    """Encodes lists of documents to (tokens [n] uint32, lengths [d] int64)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        # encode_batch_fast skips computing character offsets, which we never use.
        self._encode_batch = None
        if backend is not None:
            self._encode_batch = getattr(backend, "encode_batch_fast", None) or backend.encode_batch

    def _id_lists(self, documents: list[str]) -> list[list[int]]:
        if self._encode_batch is not None:
            return [encoding.ids for encoding in self._encode_batch(documents, add_special_tokens=False)]
        return self.tokenizer(documents, add_special_tokens=False)["input_ids"]

    def encode(self, documents: list[str]) -> tuple[np.ndarray, np.ndarray]:
        id_lists = self._id_lists(documents)
        lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
        total = int(lengths.sum())
        tokens = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.uint32, count=total)
        return tokens, lengths


class ChunkBuffer:
    """Collects encoded batches until a chunk holds at least `chunk_tokens` tokens; documents
    are never split between chunks."""

    def __init__(self, chunk_tokens: int) -> None:
        self.chunk_tokens = chunk_tokens
        self._tokens: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []
        self._size = 0

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        self._tokens.append(tokens)
        self._lengths.append(lengths)
        self._size += len(tokens)

    @property
    def full(self) -> bool:
        return self._size >= self.chunk_tokens

    def __len__(self) -> int:
        return self._size

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        tokens = np.concatenate(self._tokens) if self._tokens else np.zeros(0, np.uint32)
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)
        self._tokens, self._lengths, self._size = [], [], 0
        return tokens, lengths
