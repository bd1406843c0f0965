"""Hybrid (Gated-DeltaNet) layers over a tree: every node's conv window and recurrent state
come from its parent, never from the node before it in the flattened order. This module holds
the tree bookkeeping (which inputs each node's window reads, the window kept after acceptance);
the conv and the recurrence themselves are kernels (`kernels.gdn_tree`).

`parents` arrays are [T] with -1 meaning "the committed state". A linear sequence is the tree
with parents [-1, 0, 1, ...]; the `unsafe` hybrid mode passes exactly that for a real tree,
which is the sibling state leakage the safe mode exists to prevent.
"""

from __future__ import annotations

import torch


def flattened_parents(num_nodes: int) -> torch.Tensor:
    """Parents of a linear sequence: [-1, 0, 1, ..., T-2]."""
    return torch.arange(-1, num_nodes - 1, dtype=torch.long)


def conv_window_index(parents: list[int], kernel_size: int) -> torch.Tensor:
    """[T, K] indices into `cat(committed_window [K-1], nodes [T])`, oldest first.

    Column K-1 is the node itself, column K-2 its parent, and so on; when the path runs past
    the root it continues into the committed window (indices K-2, K-3, ...).
    """
    hist = kernel_size - 1
    rows = []
    for i in range(len(parents)):
        row = [hist + i]
        node, back = i, hist - 1
        while len(row) < kernel_size:
            p = parents[node] if node >= 0 else -1
            if node >= 0 and p >= 0:
                row.append(hist + p)
                node = p
            else:
                row.append(back)
                back -= 1
                node = -1
        rows.append(row[::-1])
    return torch.tensor(rows, dtype=torch.long).reshape(len(parents), kernel_size)


def window_after(x: torch.Tensor, committed_window: torch.Tensor, window_index: torch.Tensor, node: int) -> torch.Tensor:
    """The committed window [K-1, C] once `node` is accepted: the newest K-1 inputs of its path."""
    buf = torch.cat([committed_window.to(x.dtype), x], dim=0)
    return buf[window_index[node, 1:]].clone()


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)
