"""Hybrid (Gated-DeltaNet) layers over a tree: every node's conv window and recurrent state
come from its parent, never from the node before it in the flattened order (pure PyTorch
reference; a Triton kernel may replace `gated_delta_tree`).

`parents` arrays are [T] with -1 meaning "the committed state". A linear sequence is the tree
with parents [-1, 0, 1, ...]; the `unsafe` hybrid mode passes exactly that for a real tree,
which is the sibling state leakage the safe mode exists to prevent.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def flattened_parents(num_nodes: int) -> torch.Tensor:
    """Parents of a linear sequence: [-1, 0, 1, ..., T-2]."""
    return torch.arange(-1, num_nodes - 1, dtype=torch.long)


def node_levels(parents: list[int]) -> list[list[int]]:
    """Group node indices by depth under `parents` (parents precede children)."""
    depth: list[int] = []
    levels: list[list[int]] = []
    for i, p in enumerate(parents):
        d = 0 if p < 0 else depth[p] + 1
        depth.append(d)
        if d == len(levels):
            levels.append([])
        levels[d].append(i)
    return levels


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


def tree_causal_conv(
    x: torch.Tensor,
    committed_window: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    window_index: torch.Tensor,
) -> torch.Tensor:
    """Depthwise causal conv along each node's ancestor path, then SiLU.

    Args:
        x: [T, C] conv inputs of the nodes.
        committed_window: [K-1, C] the last K-1 committed inputs, oldest first.
        weight: [C, K] depthwise kernel (weight[:, K-1] multiplies the newest input).
        bias: [C] or None.
        window_index: [T, K] from `conv_window_index`.

    Returns:
        [T, C] activations.
    """
    buf = torch.cat([committed_window.to(x.dtype), x], dim=0)  # [K-1+T, C]
    windows = buf[window_index]  # [T, K, C]
    out = (windows * weight.t().to(x.dtype).unsqueeze(0)).sum(dim=1)
    if bias is not None:
        out = out + bias.to(x.dtype)
    return F.silu(out)


def window_after(x: torch.Tensor, committed_window: torch.Tensor, window_index: torch.Tensor, node: int) -> torch.Tensor:
    """The committed window [K-1, C] once `node` is accepted: the newest K-1 inputs of its path."""
    buf = torch.cat([committed_window.to(x.dtype), x], dim=0)
    return buf[window_index[node, 1:]].clone()


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_tree(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: list[int],
    initial_state: torch.Tensor,
    keep_states: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule along tree paths, one depth level at a time.

    Args:
        query, key: [T, H, Dk] (already L2-normalised; query already scaled by Dk**-0.5).
        value: [T, H, Dv]. g (log decay), beta: [T, H].
        parents: [T] parent per node, -1 = start from `initial_state` [H, Dk, Dv].
        keep_states: keep every node's state (tree verify); else only the last node's.

    Returns:
        (out [T, H, Dv], states [T, H, Dk, Dv] if keep_states else [1, H, Dk, Dv] of node T-1).
    """
    num_nodes = query.shape[0]
    state_dtype = initial_state.dtype
    device = value.device
    out = torch.empty(value.shape, dtype=state_dtype, device=device)
    q, k, v = query.to(state_dtype), key.to(state_dtype), value.to(state_dtype)
    decay, b = g.to(state_dtype).exp(), beta.to(state_dtype)
    if keep_states:
        # Slot 0 holds the committed state, node i lives in slot i + 1.
        slots = torch.empty((num_nodes + 1, *initial_state.shape), dtype=state_dtype, device=device)
        slots[0] = initial_state
    elif parents != list(range(-1, num_nodes - 1)):
        raise ValueError("keep_states=False is only for linear sequences (parents [-1, 0, 1, ...])")
    last = initial_state.unsqueeze(0)
    for level in node_levels(parents):
        idx = torch.tensor(level, dtype=torch.long, device=device)
        if keep_states:
            prev = slots[torch.tensor([parents[i] + 1 for i in level], dtype=torch.long, device=device)]
        else:
            prev = last
        s = prev * decay[idx][..., None, None]
        kv_mem = (s * k[idx].unsqueeze(-1)).sum(dim=-2)
        delta = (v[idx] - kv_mem) * b[idx].unsqueeze(-1)
        s = s + k[idx].unsqueeze(-1) * delta.unsqueeze(-2)
        out[idx] = (s * q[idx].unsqueeze(-1)).sum(dim=-2)
        if keep_states:
            slots[idx + 1] = s
        else:
            last = s
    return out, (slots[1:] if keep_states else last)
