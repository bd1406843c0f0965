"""Triton kernel: the verify walk on the device, one program, fixed shapes, no host sync.

The program holds the tree's tokens and parents [N] in registers and takes at most `max_depth`
steps: at each, the child of the current node whose token equals the target's choice is the
smallest index with (parent == node) & (token == choice[node]) (siblings carry distinct
tokens, and the reference takes the first match in sibling order, which is index order).
Which nodes match their parent's choice is one gather before the steps, so a step is a
reduction with no load to wait for. The path is kept in registers and stored once at the end,
the emitted tokens (the path's tokens, then the bonus) read with one gather after it.

Up to 64 rows (`JUMPS_UP_TO_ROWS`) the walk jumps instead (`_walk_jumps`, one warp): a node is accepted when it and
every ancestor matched their parent's choice, found by pointer jumping (log2(N) rounds of `tl.gather`, each AND-ing a
node's flag with its 2^k-th ancestor's and adding its depth count), so there is no loop of L block-wide reductions.
The accepted nodes form one chain from the root (a node has at most one walked child: the first matching one, a
[N, N] compare unless the caller says siblings carry distinct tokens, as TreeStep's trees do); each stores itself at
path[depth] and its token at emitted[depth - 1]. Rows no chain from the root reaches in a malformed tree (an orphan, an
out-of-range or own parent, a cycle) are never accepted, as in the reference. Measured on an H100 (2026-12-06, the
budget-15 step with the walk in CUDA graphs, 9 interleaved rounds, benchmarks/results/walk_jumps_20261206_h100.txt):
22.66 us against 24.35 with the steps (budget 22 -1.12 us, 32 -1.47, 48 -1.22; 64 rows and more keep the steps,
whose [N, N] dedupe would grow).
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


@triton.jit
def _walk_jumps(
    tok_ptr,
    par_ptr,
    n_ptr,
    choice_ptr,
    path_ptr,
    emit_ptr,
    len_ptr,
    bonus_ptr,
    N,
    NP: tl.constexpr,
    LOGN: tl.constexpr,
    DEDUPE: tl.constexpr = True,
    GDC: tl.constexpr = False,
):
    gdc_enter(GDC)
    idx = tl.arange(0, NP)
    n = tl.load(n_ptr).to(tl.int32)
    real = (idx < n) & (idx > 0)
    tok = tl.load(tok_ptr + idx, mask=real, other=-1)
    par = tl.load(par_ptr + idx, mask=real, other=-2).to(tl.int32)
    want = tl.load(choice_ptr + idx, mask=idx < N, other=-1).to(tl.int64)
    # A node's link to its parent, where the parent is a real row (a malformed tree's orphan or out-of-range parent is
    # unreachable, as in the reference); the root, padding and unlinked rows point at the root.
    linked = real & (par >= 0) & (par < n)
    up = tl.where(linked, par, 0)
    match = linked & (tok == tl.gather(want, up, 0))
    # Only the first matching child of a node (index order) is walked into: the reference's rule when siblings repeat a token.
    if DEDUPE:
        earlier = (idx[None, :] < idx[:, None]) & (par[None, :] == par[:, None]) & match[None, :]
        match = match & (tl.max(earlier.to(tl.int32), axis=1) == 0)
    # Pointer jumping: after j rounds `ok` is "every node from here up 2^j steps matched" and `dep` counts those
    # steps' edges; LOGN rounds cover any chain of NP nodes.
    ok = match | (idx == 0)
    dep = real.to(tl.int32)
    anc = up
    for _ in tl.static_range(LOGN):
        ok = ok & tl.gather(ok, anc, 0)
        dep = dep + tl.gather(dep, anc, 0)
        anc = tl.gather(anc, anc, 0)
    ok = ok & (anc == 0)  # the chain reached the root: a malformed tree's cycle never does
    # The accepted nodes are one chain from the root (a node has at most one walked child), one node a depth: each
    # stores itself at path[depth] and its token at emitted[depth - 1], the places after the chain -1 (disjoint stores).
    length = tl.sum(ok.to(tl.int32), axis=0)
    node = tl.max(tl.where(ok, dep * NP + idx, 0), axis=0) % NP  # the deepest accepted node
    bonus = tl.sum(tl.where(idx == node, want, 0), axis=0)
    tl.store(path_ptr + dep, idx.to(tl.int64), mask=ok)
    tl.store(path_ptr + idx, tl.full([NP], -1, tl.int64), mask=(idx >= length) & (idx < N))
    tl.store(emit_ptr + dep - 1, tok, mask=ok & real)
    tl.store(emit_ptr + idx, tl.where(idx == length - 1, bonus, -1), mask=(idx < N) & (idx >= length - 1))
    tl.store(len_ptr, length.to(tl.int64))
    tl.store(bonus_ptr, bonus)


# Rows (N to a power of two) up to which the walk jumps (`_walk_jumps`, one warp) instead of stepping (`_walk`): the
# budgets measured faster (15-48, module docstring); not above 64, where its [N, N] first-match tile in one warp grows
# (1,024 rows took minutes to compile).
JUMPS_UP_TO_ROWS = 64


def walk_arrays(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    target_choice: torch.Tensor,
    max_depth: int,
    out: tuple[torch.Tensor, ...] | None = None,
    num_warps: int = 4,
    pdl: bool | None = None,
    distinct_siblings: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The accepted path, emitted tokens, commit length and bonus token (Triton).

    Args:
        tokens, parents: [N] int64 tree arrays (padding from num_nodes on).
        num_nodes: [1] int64 on the same device.
        target_choice: [N] integer, the target's token at every node.
        max_depth: a bound on the tree's depth (the drafted depths L); the stepping walk takes at most
            this many steps (the jumping one needs no bound).
        out: optional (path, emitted, commit_len, bonus) buffers to fill.
        num_warps: warps of the stepping walk's program (the jumping walk takes one).
        pdl: launch with programmatic dependent launch (kernels/gdc.py; None: DDTREE_PDL, else gdc.DEFAULT).
        distinct_siblings: the caller's siblings carry distinct tokens (a top-K's trees), so the jumping walk skips
            its first-match compare; with repeated sibling tokens it would then walk wrong.

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
    np_ = triton.next_power_of_2(n_out)
    if np_ <= JUMPS_UP_TO_ROWS:
        _walk_jumps[(1,)](
            tokens, parents, num_nodes, target_choice, *out, n_out, NP=np_, LOGN=max(np_.bit_length() - 1, 0),
            DEDUPE=not distinct_siblings, num_warps=1, **launch_options(tokens, pdl),
        )
        return out
    _walk[(1,)](
        tokens, parents, num_nodes, target_choice, max_depth, *out, n_out, NP=np_, num_warps=num_warps,
        **launch_options(tokens, pdl),
    )
    return out
