"""Reference: each node may attend to itself and its ancestors, nothing else in the tree."""

from __future__ import annotations

import torch


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """[N, N] bool, True where node i may attend to node j (j is i or an ancestor of i).

    Args:
        parents: [N] parent index per node, -1 for a root; every parent precedes its children
            (depth-major order), which lets row i copy its parent's row.

    Returns:
        The mask on the CPU.
    """
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= i:
            raise ValueError(f"expected parents to precede their children, got node {i} with parent {p}")
        if p >= 0:
            mask[i] = mask[p]
        mask[i, i] = True
    return mask
