"""Reference: log-softmax over the vocabulary, then the K best tokens of every depth."""

from __future__ import annotations

import torch


def sorted_topk_logprobs(draft_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` most probable tokens per row of `draft_logits`, best first.

    Args:
        draft_logits: [L, V] the drafter's logits for the L positions after the root.
        k: candidates per row, 1 <= k <= V.

    Returns:
        (logprobs [L, k] float64, token_ids [L, k] long). Ties go to the lower token id (a
        stable sort), so the tree built from them is deterministic.
    """
    if draft_logits.dim() != 2:
        raise ValueError(f"expected draft_logits [L, V], got shape {tuple(draft_logits.shape)}")
    if not 1 <= k <= draft_logits.shape[1]:
        raise ValueError(f"expected 1 <= k <= V = {draft_logits.shape[1]}, got k = {k}")
    logprobs = torch.log_softmax(draft_logits.double(), dim=-1)
    order = torch.sort(-logprobs, dim=-1, stable=True).indices[:, :k]
    return logprobs.gather(-1, order), order
