"""Triton kernel: the verify walk on the device, one program, fixed shapes, no host sync.

The program holds the tree's tokens and parents [N] in registers and takes at most `max_depth`
steps: at each, the child of the current node whose token equals the target's choice is the
smallest index with (parent == node) & (token == choice[node]) (siblings carry distinct
tokens, and the reference takes the first match in sibling order, which is index order).
The path and the emitted tokens are kept in registers and stored once at the end.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _walk(
    tok_ptr,
    par_ptr,
    n_ptr,
    choice_ptr,
    max_depth,
    path_ptr,
    emit_ptr,
    len_ptr,
    bonus_ptr,
    N,
    NP: tl.constexpr,
):
    idx = tl.arange(0, NP)
    n = tl.load(n_ptr).to(tl.int32)
    real = (idx < n) & (idx > 0)
    tok = tl.load(tok_ptr + idx, mask=real, other=-1)
    par = tl.load(par_ptr + idx, mask=real, other=-2).to(tl.int32)
    zero = tl.program_id(0) * 0
    node = zero
    length = zero + 1
    active = zero == 0
    path = tl.where(idx == 0, 0, -1).to(tl.int64)
    emit = tl.full([NP], -1, tl.int64)
    for _ in range(0, max_depth):
        want = tl.load(choice_ptr + node).to(tl.int64)
        hit = (par == node) & (tok == want) & active
        child = tl.min(tl.where(hit, idx, NP), axis=0)
        found = child < NP
        path = tl.where(found & (idx == length), child.to(tl.int64), path)
        emit = tl.where(found & (idx == length - 1), want, emit)
        length += found.to(tl.int32)
        node = tl.where(found, child, node)
        active = found
    bonus = tl.load(choice_ptr + node).to(tl.int64)
    emit = tl.where(idx == length - 1, bonus, emit)
    tl.store(path_ptr + idx, path, mask=idx < N)
    tl.store(emit_ptr + idx, emit, mask=idx < N)
    tl.store(len_ptr, length.to(tl.int64))
    tl.store(bonus_ptr, bonus)


def walk_arrays(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    target_choice: torch.Tensor,
    max_depth: int,
    out: tuple[torch.Tensor, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The accepted path, emitted tokens, commit length and bonus token (Triton).

    Args:
        tokens, parents: [N] int64 tree arrays (padding from num_nodes on).
        num_nodes: [1] int64 on the same device.
        target_choice: [N] integer, the target's token at every node.
        max_depth: a bound on the tree's depth (the drafted depths L); the walk takes at most
            this many steps.
        out: optional (path, emitted, commit_len, bonus) buffers to fill.

    Returns:
        As tree_walk.reference.walk_arrays.
    """
    n_out = tokens.shape[0]
    if tokens.dim() != 1 or parents.shape != tokens.shape or target_choice.shape != tokens.shape:
        raise ValueError(
            f"expected tokens, parents and target_choice [N] alike, got {tuple(tokens.shape)}, "
            f"{tuple(parents.shape)} and {tuple(target_choice.shape)}"
        )
    device = tokens.device
    if out is None:
        out = (
            torch.empty(n_out, dtype=torch.int64, device=device),
            torch.empty(n_out, dtype=torch.int64, device=device),
            torch.empty(1, dtype=torch.int64, device=device),
            torch.empty(1, dtype=torch.int64, device=device),
        )
    _walk[(1,)](
        tokens, parents, num_nodes, target_choice, max_depth, *out, n_out, NP=triton.next_power_of_2(n_out), num_warps=4
    )
    return out
