"""Static tree shapes for the SGLang worker (pure Python: no torch, no sglang)."""

from __future__ import annotations


def max_tree_nodes(depths: int, topk: int) -> int:
    """The most nodes a tree of `depths` levels with `topk` candidates per level can have.

    Args:
        depths: L, the drafted depths (block size - 1).
        topk: K, candidates per depth.

    Returns:
        sum over d = 1..L of K**d: every prefix of length d picks one of K tokens per level.
        The verify width of a (budget, topk) step is min(budget, this) + 1, a shape known at
        startup, so buffers and CUDA graphs can be sized once.
    """
    if depths < 0 or topk < 0:
        raise ValueError(f"expected depths >= 0 and topk >= 0, got {depths}, {topk}")
    total, level = 0, 1
    for _ in range(depths):
        level *= topk
        total += level
        if total > 1 << 40:
            break
    return total


def verify_width(budget: int, topk: int, block_size: int) -> int:
    """Rows the target verifies per request: the root plus the tree's nodes.

    Args:
        budget: drafted nodes requested; topk: candidates per depth; block_size: the drafter's
            block (depths = block_size - 1).

    Returns:
        min(budget, max_tree_nodes(block_size - 1, topk)) + 1.
    """
    return min(budget, max_tree_nodes(block_size - 1, topk)) + 1
