"""N-gram counts over a verifier's tokens: training from corpora, compact storage, queries.

Modules, in the order data flows through them:
  corpus.py    documents (lines / JSONL or TSV records) read from plain, gzipped or directory corpora
  tokenize.py  batched tokenisation into flat uint32 arrays, and the tokenizer fingerprint
  trie.py      counts as sorted arrays, one level per order; merging and pruning
  counting.py  vectorised counting of one chunk of tokens, and streaming merges of chunks
  storage.py   the versioned, checksummed file format
  query.py     the loaded model: back-off lookups, distributions, precomputed best continuations
  train.py     corpus -> tokens -> counts -> file, with a progress bar and a report
  cli.py       `polyspec ngram train | top | stats | merge`
"""

MAX_ORDER = 8


def load(path):
    """The n-gram model in the file at `path`, ready to query (its `fingerprint` says which
    tokenizer it counts tokens of)."""
    from polyspec.ngram.query import NGramModel
    from polyspec.ngram.storage import load as read

    stored = read(path)
    model = NGramModel(stored)
    model.fingerprint = stored.fingerprint
    return model
