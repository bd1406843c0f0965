"""Triton kernel: the verify walk on the device, one program, fixed shapes, no host sync.

The program holds the tree's tokens and parents [N] in registers and takes at most `max_depth`
steps: at each, the child of the current node whose token equals the target's choice is the
smallest index with (parent == node) & (token == choice[node]) (siblings carry distinct
tokens, and the reference takes the first match in sibling order, which is index order).
Which nodes match their parent's choice is one gather before the steps, so a step is a
reduction with no load to wait for. The path is kept in registers and stored once at the end,
the emitted tokens (the path's tokens, then the bonus) read with one gather after it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..gdc import gdc_enter, launch_options


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
    GDC: tl.constexpr = False,
):
    gdc_enter(GDC)
    idx = tl.arange(0, NP)
    n = tl.load(n_ptr).to(tl.int32)
    real = (idx < n) & (idx > 0)
    tok = tl.load(tok_ptr + idx, mask=real, other=-1)
    par = tl.load(par_ptr + idx, mask=real, other=-2).to(tl.int32)
    # Node i matches if its token is the target's choice at its parent: one gather before the loop,
    # so the steps below are reductions only (no load waits on the step before).
    match = real & (tok == tl.load(choice_ptr + tl.maximum(par, 0), mask=real, other=-1).to(tl.int64))
    zero = tl.program_id(0) * 0
    node = zero
    length = zero + 1
    active = zero == 0
    path = tl.where(idx == 0, 0, -1).to(tl.int64)
    for _ in range(0, max_depth):
        child = tl.min(tl.where((par == node) & match & active, idx, NP), axis=0)
        found = child < NP
        path = tl.where(found & (idx == length), child.to(tl.int64), path)
        length += found.to(tl.int32)
        node = tl.where(found, child, node)
        active = found
    # Emitted: each accepted node's token (the target's choice at its parent), then the bonus.
    emit = tl.load(tok_ptr + tl.maximum(path, 0), mask=(idx > 0) & (idx < length), other=-1)
    bonus = tl.load(choice_ptr + node).to(tl.int64)
    tl.store(path_ptr + idx, path, mask=idx < N)
    # emitted[j] is path[j + 1]'s token: the loads above are one place ahead; shift by storing one place back.
    tl.store(emit_ptr + idx - 1, emit, mask=(idx > 0) & (idx < length))
    tl.store(emit_ptr + idx, tl.where(idx == length - 1, bonus, -1), mask=(idx < N) & (idx >= length - 1))
    tl.store(len_ptr, length.to(tl.int64))
    tl.store(bonus_ptr, bonus)


def walk_arrays(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    target_choice: torch.Tensor,
    max_depth: int,
    out: tuple[torch.Tensor, ...] | None = None,
    num_warps: int = 4,
    pdl: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The accepted path, emitted tokens, commit length and bonus token (Triton).

    Args:
        tokens, parents: [N] int64 tree arrays (padding from num_nodes on).
        num_nodes: [1] int64 on the same device.
        target_choice: [N] integer, the target's token at every node.
        max_depth: a bound on the tree's depth (the drafted depths L); the walk takes at most
            this many steps.
        out: optional (path, emitted, commit_len, bonus) buffers to fill.
        num_warps: warps of the one program.
        pdl: launch with programmatic dependent launch (kernels/gdc.py; None: DDTREE_PDL, else gdc.DEFAULT).

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
        tokens, parents, num_nodes, target_choice, max_depth, *out, n_out, NP=triton.next_power_of_2(n_out), num_warps=num_warps,
        **launch_options(tokens, pdl),
    )
    return out
