"""A suffix-array index over a corpus in a verifier's tokens, and the drafter that drafts from
its longest matches (docs/NGRAM.md, "The suffix index").

Modules, in the order data flows through them:
  array.py    the suffix array of a token text with document separators (vectorised numpy)
  build.py    documents (strings, or corpus files) -> tokens -> suffix array -> file, with a report
  storage.py  the file: safetensors, memory-mapped on load
  index.py    longest-match queries and the continuations of a match
  drafter.py  SuffixDrafter: greedy and sampled drafts from the matches
  spec.py     `suffix:PATH[+context]` -> a drafter for a verifier
"""
