"""Drafters: what proposes tokens for the verifier to check."""

from polyspec.drafters.base import Drafter, NoDrafter

__all__ = ["Drafter", "NoDrafter"]
