"""PyTorch reference of the tree causal-conv1d update in SGLang's verify layout.

What SGLang 0.5.23's `causal_conv1d_update` does on its tree path (`retrieve_next_token` given,
`num_accept_tokens` and `cache_seqlens` None), written as plain loops so the kernel beside it and
SGLang's own kernel can both be checked against it:

- parents from the first-child / next-sibling links, in row order: row `next_token[i]`'s parent is
  i, row `next_sibling[i]`'s parent is row i's; a row nobody names (the root, a pad row) gets 0;
- each row's K taps walk up its ancestors: itself (weight column K-1), its parent (K-2), ...; from
  row 0 upwards the taps continue into the cache line's conv state, newest column first;
- out = SiLU(bias + sum of tap * weight), each product in the inputs' dtype, the sum in fp32;
- every row's window (its K-1 newest taps, oldest first) into the intermediate buffer;
- the cache line's conv state becomes its last K-1 inputs in row order (what a chain would leave).
"""

from __future__ import annotations

import torch


def tree_parents(next_token: torch.Tensor, next_sibling: torch.Tensor) -> torch.Tensor:
    """[B, T] parents from [B, T] first-child / next-sibling links (-1 = none), as SGLang derives them.

    Rows are taken in order; a row named by nobody keeps 0, as does the root.
    """
    batch, rows = next_token.shape
    parents = torch.zeros_like(next_token)
    for b in range(batch):
        nt, ns, par = next_token[b].tolist(), next_sibling[b].tolist(), [0] * rows
        for i in range(rows):
            if 0 <= nt[i] < rows:
                par[nt[i]] = i
            if 0 <= ns[i] < rows:
                par[ns[i]] = par[i]
        parents[b] = torch.tensor(par, dtype=next_token.dtype)
    return parents


def tree_conv_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    silu: bool,
    conv_state_indices: torch.Tensor | None,
    intermediate_conv_window: torch.Tensor | None,
    intermediate_state_indices: torch.Tensor | None,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    retrieve_parent_token: torch.Tensor,
    pad_slot_id: int = -1,
) -> torch.Tensor:
    """The tree update (module docstring), in place on conv_state, the intermediate windows and the parents.

    Args:
        x: [B, C, T] the verify rows' conv inputs (B requests of T rows).
        conv_state: [lines, C, >= K-1] the cache; a request's line is conv_state_indices[b] (b without them).
        weight: [C, K]; bias: [C] or None; silu: apply SiLU.
        intermediate_conv_window: [lines', T', C, K-1] or None; a request's line is intermediate_state_indices[b].
        retrieve_next_token, retrieve_next_sibling: [B, >= T] links; retrieve_parent_token: [B, >= T], written.
        pad_slot_id: a request whose line is this is skipped (its output rows are left as zeros).

    Returns:
        [B, C, T] outputs in x's dtype.
    """
    batch, channels, rows = x.shape
    width = weight.shape[1]
    out = torch.zeros_like(x)
    parents = tree_parents(retrieve_next_token[:, :rows], retrieve_next_sibling[:, :rows])
    for b in range(batch):
        line = int(conv_state_indices[b]) if conv_state_indices is not None else b
        if line == pad_slot_id:
            continue
        windowed = intermediate_conv_window is not None and conv_state_indices is not None
        inter_line = int(intermediate_state_indices[b]) if windowed else b  # where the windows go
        retrieve_parent_token[b, :rows] = parents[b]
        state = conv_state[line, :, : width - 1].clone()  # [C, K-1] before this update's write
        par = parents[b].tolist()
        for t in range(rows):
            acc = torch.zeros(channels, dtype=torch.float32) if bias is None else bias.float().clone()
            v = t
            for j in range(width):
                tap = x[b, :, v] if v >= 0 else state[:, width - 1 + v]
                if intermediate_conv_window is not None and j <= width - 2:
                    intermediate_conv_window[inter_line, t, :, width - 2 - j] = tap
                acc += (tap * weight[:, width - 1 - j]).float()
                v = par[v] if v > 0 else v - 1
            out[b, :, t] = (acc / (1 + torch.exp(-acc)) if silu else acc).to(x.dtype)
        # The line's state: its K-1 newest inputs in row order.
        history = torch.cat([state, x[b].to(state.dtype)], dim=1)
        conv_state[line, :, : width - 1] = history[:, -(width - 1) :]
    return out
