"""N-gram counts over a verifier's tokens: training, compact storage, queries.

Modules, in the order data flows through them:
  corpus.py    documents (lines / JSONL or TSV records) read from plain, gzipped or directory corpora
  tokenize.py  batched tokenisation into flat uint32 arrays
  trie.py      counts as sorted arrays, one level per order; merging and pruning
  counting.py  vectorised counting of one chunk of tokens, and streaming merges of chunks
  storage.py   the file: safetensors, memory-mapped on load, with its header and data hashes
  query.py     the loaded model: back-off lookups, distributions, best continuations
  train.py     documents (strings, or corpus files) -> tokens -> counts -> file, with a report
  cli.py       `polyspec ngram train | top | stats | verify | convert | merge`
"""

MAX_ORDER = 8


def load(path):
    """The n-gram model in the file at `path`, ready to query: its `fingerprint` says which
    tokenizer it counts tokens of, its `metadata` where the counts come from."""
    from polyspec.ngram.query import NGramModel
    from polyspec.ngram.storage import load as read

    return NGramModel(read(path))


# The trainer, as `polyspec.ngram.train(tokenizer, documents, order=..., out=...)`.
from polyspec.ngram.train import train as train  # noqa: E402
