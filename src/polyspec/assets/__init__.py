"""The embedded offline assets (verifier, tokenizers, corpora), the language registry and UDHR text."""
