"""Per-depth log-probabilities and their sorted top-K (the tree builder's candidates)."""

from .reference import sorted_topk_logprobs

__all__ = ["sorted_topk_logprobs"]
