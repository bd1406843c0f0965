"""Reference: log-softmax over the vocabulary, then the K best tokens of every depth."""

from __future__ import annotations

import torch

# What a +inf logit counts as (the kernel's `_FLT_MAX`).
FLT_MAX = torch.finfo(torch.float32).max


def finite_logits(draft_logits: torch.Tensor) -> torch.Tensor:
    """The logits as float64 with a NaN as -inf and +inf as the largest finite fp32 value.

    A drafter that overflowed still gives a tree of vocabulary ids: a NaN token has probability 0, the
    +inf tokens of a row share its probability (softmax's limit). -inf stays -inf.
    """
    x = draft_logits.double()
    x = torch.where(torch.isnan(x), float("-inf"), x)
    return torch.where(x == float("inf"), FLT_MAX, x)


def sorted_topk_logprobs(draft_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` most probable tokens per row of `draft_logits`, best first.

    Args:
        draft_logits: [L, V] the drafter's logits for the L positions after the root.
        k: candidates per row, 1 <= k <= V.

    Returns:
        (logprobs [L, k] float64, token_ids [L, k] long). Ties go to the lower token id (a
        stable sort of the logits), so the tree built from them is deterministic. Non-finite logits
        as `finite_logits` maps them.
    """
    if draft_logits.dim() != 2:
        raise ValueError(f"expected draft_logits [L, V], got shape {tuple(draft_logits.shape)}")
    if not 1 <= k <= draft_logits.shape[1]:
        raise ValueError(f"expected 1 <= k <= V = {draft_logits.shape[1]}, got k = {k}")
    logits = finite_logits(draft_logits)
    logprobs = torch.log_softmax(logits, dim=-1)
    # A row with no finite logit (NaN or -inf only): -inf everywhere, as the kernel gives (log_softmax gives NaN).
    logprobs = torch.where(torch.isnan(logprobs), float("-inf"), logprobs)
    # Ranked by the logits, the log-probs' order where those differ (x - c is monotone); where the subtraction
    # rounds distinct logits to one log-prob (beside a +inf logit's FLT_MAX) the larger logit still goes first.
    order = torch.sort(-logits, dim=-1, stable=True).indices[:, :k]
    return logprobs.gather(-1, order), order
