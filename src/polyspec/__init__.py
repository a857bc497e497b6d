"""polyspec: lossless speculative decoding that pays off in every language."""

__version__ = "0.1.0"
