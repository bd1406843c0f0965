"""The ancestor-only attention mask of a draft tree."""

from .reference import ancestor_mask

__all__ = ["ancestor_mask"]
