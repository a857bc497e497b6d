"""Drafters: what proposes tokens for the verifier to check."""

from polyspec.drafters.base import Drafter, NoDrafter, make_drafter, parse_spec

__all__ = ["Drafter", "NoDrafter", "make_drafter", "parse_spec"]
