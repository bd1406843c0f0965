"""Reference: the Gated-DeltaNet causal conv and gated delta rule along tree paths.

`parents` arrays are [T] with -1 meaning "the committed state"; every parent precedes its
children. A linear sequence is the tree with parents [-1, 0, 1, ...].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
        query, key: [T, Hk, Dk] (already L2-normalised; query already scaled by Dk**-0.5);
            Hk divides H, and value head h reads key head h // (H / Hk) (repeat_interleave).
        value: [T, H, Dv]. g (log decay), beta: [T, H].
        parents: [T] parent per node, -1 = start from `initial_state` [H, Dk, Dv].
        keep_states: keep every node's state (tree verify); else only the last node's.

    Returns:
        (out [T, H, Dv], states [T, H, Dk, Dv] if keep_states else [1, H, Dk, Dv] of node T-1).
    """
    num_nodes = query.shape[0]
    ratio = value.shape[1] // query.shape[1]
    if ratio > 1:
        query, key = query.repeat_interleave(ratio, dim=1), key.repeat_interleave(ratio, dim=1)
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


def commit_gdn_state(
    states: torch.Tensor,
    node: torch.Tensor | int,
    state_out: torch.Tensor,
    conv_input: torch.Tensor,
    window_index: torch.Tensor,
    window: torch.Tensor,
) -> None:
    """Write the accepted node's recurrent state and conv window into the cache slot.

    Args:
        states: [T, H, Dk, Dv] per-node states of the verify forward.
        node: the last accepted node (int or one-element integer tensor).
        state_out: [H, Dk, Dv] the cache's state slot, overwritten.
        conv_input: [T, C] the nodes' conv inputs.
        window_index: [T, K] the verify forward's window index.
        window: [K-1, C] the committed window, overwritten in place with the newest K-1
            inputs of the accepted node's path.
    """
    node = int(node)
    buf = torch.cat([window, conv_input.to(window.dtype)], dim=0)  # [K-1+T, C]
    window.copy_(buf[window_index[node, 1:]])
    state_out.copy_(states[node])
