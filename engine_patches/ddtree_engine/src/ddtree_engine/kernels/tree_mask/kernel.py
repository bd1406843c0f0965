"""Triton kernel: compile a fixed-shape draft tree for verify, no host sync.

One program per block of BR rows (ROWS_PER_PROGRAM = 4 by default: the rows' climbs below are the
kernel's time, so small blocks side by side beat large ones; measured figures at the constant). A row's ancestors are found by climbing its parent chain
(at most L + 1 steps: the tree's depth bound), marking one column of the dense mask and one bit
of the packed mask per step (each step a load of the next parent, or from 49 to 193 rows a `tl.gather` from the
parent array read once: `climbs_by_gather`, measured at GATHER_FROM_ROWS); first_child and next_sibling are one compare-and-min over the
parent array each. Padding rows (from num_nodes on) see only themselves.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..gdc import gdc_enter, launch_options


@triton.jit
def _compile_tree(
    par_ptr,
    dep_ptr,
    n_ptr,
    prefix_ptr,
    max_depth,
    mask_ptr,
    packed_ptr,
    pos_ptr,
    fc_ptr,
    ns_ptr,
    N,
    W,
    BR: tl.constexpr,
    NP: tl.constexpr,
    WP: tl.constexpr,
    GATHER: tl.constexpr = False,
    GDC: tl.constexpr = False,
):
    gdc_enter(GDC)
    _compile_rows(tl.program_id(0) * BR, par_ptr, dep_ptr, n_ptr, prefix_ptr, max_depth, mask_ptr, packed_ptr, pos_ptr, fc_ptr,
                  ns_ptr, N, W, BR, NP, WP, GATHER)


@triton.jit
def _compile_rows(
    row0, par_ptr, dep_ptr, n_ptr, prefix_ptr, max_depth, mask_ptr, packed_ptr, pos_ptr, fc_ptr, ns_ptr, N, W,
    BR: tl.constexpr, NP: tl.constexpr, WP: tl.constexpr, GATHER: tl.constexpr = False,
):
    """Rows row0 .. row0 + BR - 1 of the compiled tree (one program's share).

    GATHER: the parent array is read once ([NP], in registers) and each step of the climb is a `tl.gather` from
    it (warp shuffles) instead of a load that waits on the one before; the same arrays."""
    rows = row0 + tl.arange(0, BR)
    cols = tl.arange(0, NP)
    words = tl.arange(0, WP)
    n = tl.load(n_ptr).to(tl.int32)
    rmask = rows < N
    real_row = rows < n
    real_col = cols < n
    dense = tl.zeros([BR, NP], dtype=tl.int1)
    packed = tl.zeros([BR, WP], dtype=tl.int64)
    node = tl.where(rmask, rows, -1)
    par_all = tl.load(par_ptr + cols, mask=real_col, other=-2).to(tl.int32)
    for _ in range(0, max_depth + 1):
        on = node >= 0
        dense = dense | ((cols[None, :] == node[:, None]) & on[:, None])
        bit = tl.where(on, tl.full([BR], 1, tl.int64) << (node & 31).to(tl.int64), 0)
        packed = packed | tl.where(words[None, :] == (node >> 5)[:, None], bit[:, None], 0)
        if GATHER:
            # A climbing node is a real row (< n), whose parent par_all holds (-1 for the root).
            nxt = tl.gather(par_all, tl.minimum(tl.maximum(node, 0), NP - 1), 0)
        else:
            nxt = tl.load(par_ptr + node, mask=on & real_row, other=-1).to(tl.int32)
        node = tl.where(on & real_row, nxt, -1)
    store_rc = rmask[:, None] & (cols[None, :] < N)
    tl.store(mask_ptr + rows[:, None] * N + cols[None, :], dense, mask=store_rc)
    tl.store(packed_ptr + rows[:, None] * W + words[None, :], packed.to(tl.int32), mask=rmask[:, None] & (words[None, :] < W))

    none = NP
    child = (par_all[None, :] == rows[:, None]) & real_row[:, None]
    first = tl.min(tl.where(child, cols[None, :], none), axis=1)
    my_par = tl.load(par_ptr + rows, mask=real_row, other=-1).to(tl.int32)
    later = (par_all[None, :] == my_par[:, None]) & (cols[None, :] > rows[:, None]) & (my_par >= 0)[:, None]
    nxt_sib = tl.min(tl.where(later, cols[None, :], none), axis=1)
    tl.store(fc_ptr + rows, tl.where(first == none, -1, first).to(tl.int64), mask=rmask)
    tl.store(ns_ptr + rows, tl.where(nxt_sib == none, -1, nxt_sib).to(tl.int64), mask=rmask)
    prefix = tl.load(prefix_ptr).to(tl.int64)
    dep = tl.load(dep_ptr + rows, mask=real_row, other=0).to(tl.int64)
    tl.store(pos_ptr + rows, prefix + dep, mask=rmask)


@triton.jit
def _compile_chosen(n_chosen, cm, place, chosen, prefix_ptr, mask_ptr, packed_ptr, pos_ptr, fc_ptr, ns_ptr,
                    N: tl.constexpr, W: tl.constexpr, NB: tl.constexpr, NP: tl.constexpr, LJ: tl.constexpr):
    """The compiled arrays of the tree tree_build.kernel's serial build has just laid out, from its registers
    (`_build_compile_tree`; N <= 64 rows): per selection index c (cm: chosen), the node's place and `chosen` =
    (parent selection, depth - 1, rank, score, and by frontier slot q: the first node popped from it, how many were;
    slot q holds the children of selection q - 1, slot 0 the root's). No parent climb: each node's ancestors as one
    integer's bits (by place, the root's bit 0 in every row) by pointer jumping, LJ rounds of `tl.gather`
    (2^LJ >= NB >= any chain); its first child the first node popped from slot c + 1; its next sibling the next place
    where its parent has more children than its rank + 1 (siblings sit side by side, by rank). The root and padding
    rows (the rest) stored apart; every row written once."""
    par, dep, rnk, _, first, kids = chosen
    ci = tl.arange(0, NB)
    bits = tl.where(cm, (tl.full([NB], 1, tl.int64) << place) | 1, 0)
    up = tl.where(cm, par, -1)
    for _ in tl.static_range(LJ):
        has = up >= 0
        at = tl.maximum(up, 0)
        bits = bits | tl.where(has, tl.gather(bits, at, 0), 0)
        up = tl.where(has, tl.gather(up, at, 0), -1)
    cols = tl.arange(0, NP)
    seen = ((bits[:, None] >> cols[None, :].to(tl.int64)) & 1) != 0
    tl.store(mask_ptr + place[:, None] * N + cols[None, :], seen, mask=cm[:, None] & (cols[None, :] < N))
    rows = tl.arange(0, NP)
    rest = (rows < N) & ((rows == 0) | (rows > n_chosen))
    tl.store(mask_ptr + rows[:, None] * N + cols[None, :], rows[:, None] == cols[None, :],
             mask=rest[:, None] & (cols[None, :] < N))
    own = tl.full([NP], 1, tl.int64) << (rows % 32).to(tl.int64)
    for w in tl.static_range(W):
        tl.store(packed_ptr + place * W + w, ((bits >> (32 * w)) & 0xFFFFFFFF).to(tl.int32), mask=cm)
        tl.store(packed_ptr + rows * W + w, tl.where(rows // 32 == w, own, 0).to(tl.int32), mask=rest)
    prefix = tl.load(prefix_ptr).to(tl.int64)
    tl.store(pos_ptr + place, prefix + dep.to(tl.int64) + 1, mask=cm)
    tl.store(pos_ptr + rows, tl.zeros([NP], dtype=tl.int64) + prefix, mask=rest)
    child = tl.where(ci + 1 < NB, tl.gather(first, tl.minimum(ci + 1, NB - 1), 0), -1)
    tl.store(fc_ptr + place, tl.where(child >= 0, tl.gather(place, tl.maximum(child, 0), 0), -1), mask=cm)
    more = rnk + 1 < tl.gather(kids, par + 1, 0)  # par + 1: the slot of the node's parent's children (0: the root's)
    tl.store(ns_ptr + place, tl.where(more, place + 1, -1), mask=cm)
    # The root's first child is selection 0 (the first pop: depth 0, rank 0), at place 1.
    tl.store(fc_ptr + rows, tl.where((rows == 0) & (n_chosen > 0), 1, -1).to(tl.int64), mask=rest)
    tl.store(ns_ptr + rows, tl.full([NP], -1, tl.int64), mask=rest)


def compile_tree_arrays(
    parents: torch.Tensor,
    depths: torch.Tensor,
    num_nodes: torch.Tensor,
    prefix_len: torch.Tensor,
    max_depth: int,
    out: tuple[torch.Tensor, ...] | None = None,
    rows_per_program: int | None = None,
    num_warps: int = 4,
    pdl: bool | None = None,
    gather: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mask, packed mask, positions and child/sibling links of a padded tree (Triton).

    Args:
        parents, depths: [N] int64, depth-major, padding from `num_nodes` on.
        num_nodes: [1] int64 on the same device (read by the kernel).
        prefix_len: [1] int64 on the same device: the root's position.
        max_depth: a bound on the tree's depth (the drafted depths L).
        out: optional (mask, packed, positions, first_child, next_sibling) buffers to fill.
        rows_per_program: rows per program (a power of two; None: ROWS_PER_PROGRAM); num_warps: warps
            per program.
        pdl: launch with programmatic dependent launch (kernels/gdc.py; None: DDTREE_PDL, else gdc.DEFAULT).
        gather: climb the parent chains by `tl.gather` from the parents read once (`_compile_rows`' GATHER)
            instead of a load a step; the same arrays. None: `climbs_by_gather(N)`.

    Returns:
        As tree_mask.reference.compile_tree_arrays.
    """
    if parents.dim() != 1 or parents.shape != depths.shape:
        raise ValueError(f"expected parents and depths [N] alike, got {tuple(parents.shape)} and {tuple(depths.shape)}")
    if num_nodes.numel() != 1 or prefix_len.numel() != 1:
        raise ValueError(f"expected one-element num_nodes and prefix_len, got {num_nodes.numel()} and {prefix_len.numel()}")
    n_out = parents.shape[0]
    words = triton.cdiv(n_out, 32)
    device = parents.device
    if out is None:
        long = dict(dtype=torch.int64, device=device)
        out = (
            torch.empty(n_out, n_out, dtype=torch.bool, device=device),
            torch.empty(n_out, words, dtype=torch.int32, device=device),
            torch.empty(n_out, **long),
            torch.empty(n_out, **long),
            torch.empty(n_out, **long),
        )
    consts = launch_constants(n_out, rows_per_program)
    if gather is None:
        gather = climbs_by_gather(n_out)
    _compile_tree[(triton.cdiv(n_out, consts["BR"]),)](
        parents, depths, num_nodes, prefix_len, max_depth, *out, n_out, words, **consts, GATHER=gather,
        num_warps=num_warps, **launch_options(parents, pdl),
    )
    return out


# Rows a program compiles. Measured on the H200 (2026-12-02 21:48 sweep, benchmarks/results/
# tree_step_sweep_20261202.json; 4 warps, CUDA graph, compile alone):
# budget 15 6.6 us at 4 rows against 7.5 at 16; budget 64 8.9 against 12.2; budget 256 9.2 against 22.8
# (8 rows 13.2, 32 rows 36.5): a row climbs its parent chain, so fewer rows a program run side by side.
ROWS_PER_PROGRAM = 4
# The tree sizes (N rows) at which the compile climbs by gather (`compile_tree_arrays`' gather=None, `climbs_by_gather`).
# H100, 2026-12-06, the step with the walk in CUDA graphs (PDL, TreeStep's default build), gather against loads, medians
# of interleaved rounds in three runs (benchmarks/results/tail_launch_20261206_h100.txt, gathers_20261206_h100.txt,
# compile_gather_20261206_h100.txt): budget 48 -0.25 us, 64 -1.29 / -1.28 / -0.96, 96 -1.38, 128 -1.38 / -0.77, 192
# -1.83. Below the range: 15 +0.29 / +0.03, 22 -0.16 / -0.29 (a small gain, but 32, between it and 48, +0.29); above it:
# 256 +0.51 / +0.32 (the compile alone 0.6-0.8 us faster there, the step not). TreeStep(fused=True)'s compile keeps the
# loads.
GATHER_FROM_ROWS = 49
GATHER_UP_TO_ROWS = 193


def climbs_by_gather(n_out: int) -> bool:
    """Whether the compile of an N-row tree climbs by gather by default (GATHER_FROM_ROWS .. GATHER_UP_TO_ROWS)."""
    return GATHER_FROM_ROWS <= n_out <= GATHER_UP_TO_ROWS


def launch_constants(n_out: int, rows_per_program: int | None = None) -> dict:
    """BR (rows a program compiles, a power of two up to N's), NP (N to a power of two) and WP (the
    packed mask's words a row, to a power of two); tree_step's one-launch kernel takes the same."""
    rows_per_program = rows_per_program or ROWS_PER_PROGRAM
    return dict(BR=min(rows_per_program, triton.next_power_of_2(n_out)), NP=triton.next_power_of_2(n_out),
                WP=triton.next_power_of_2(triton.cdiv(n_out, 32)))


@triton.jit
def _flat_verify_mask(block_ptr, prefix_ptr, out_ptr, numel, C, BLOCK: tl.constexpr, CP: tl.constexpr):
    # One program per (request b, verify row r): its row of C * (prefix_b + C) cells starts after the
    # earlier requests' blocks (summed here from the prefix lengths: no host offsets).
    b = tl.program_id(0)
    r = tl.program_id(1)
    start = tl.zeros([], dtype=tl.int64)
    for j in range(0, b):
        start += C * (tl.load(prefix_ptr + j).to(tl.int64) + C)
    p = tl.load(prefix_ptr + b).to(tl.int64)
    row = start + r * (p + C)
    ones = tl.full([BLOCK], 1, tl.int8)
    for c0 in range(0, p, BLOCK):
        cols = c0 + tl.arange(0, BLOCK).to(tl.int64)
        idx = row + cols
        tl.store(out_ptr + idx, ones.to(out_ptr.dtype.element_ty), mask=(cols < p) & (idx < numel))
    cols = tl.arange(0, CP)
    seen = tl.load(block_ptr + (b * C + r) * C + cols, mask=cols < C, other=0)
    idx = row + p + cols
    tl.store(out_ptr + idx, seen.to(out_ptr.dtype.element_ty), mask=(cols < C) & (idx < numel))


def flat_verify_mask(block: torch.Tensor, prefix: torch.Tensor, out: torch.Tensor, cols_per_step: int = 1024) -> None:
    """SGLang's flat TARGET_VERIFY custom mask, written into `out` with one launch and no host read
    (so a CUDA graph can hold it). As tree_mask.reference.flat_verify_mask.

    Args:
        block: [bs, C, C] bool; prefix: [bs] or [bs, 1] integer; out: [M] flat bool or uint8.
        cols_per_step: the prefix cells one program writes per loop step (a power of two).
    """
    if block.dim() != 3 or block.shape[1] != block.shape[2] or block.dtype != torch.bool:
        raise ValueError(f"expected block [bs, C, C] bool, got {tuple(block.shape)} {block.dtype}")
    bs, c = block.shape[0], block.shape[1]
    if prefix.numel() != bs or prefix.dtype.is_floating_point:
        raise ValueError(f"expected {bs} integer prefix lengths, got {tuple(prefix.shape)} {prefix.dtype}")
    if out.dim() != 1 or out.dtype not in (torch.bool, torch.uint8):
        raise ValueError(f"expected a flat bool or uint8 mask buffer, got {tuple(out.shape)} {out.dtype}")
    if not (block.is_contiguous() and prefix.is_contiguous() and out.is_contiguous()):
        raise ValueError("expected contiguous block, prefix and out")
    if bs == 0 or c == 0:
        return
    _flat_verify_mask[(bs, c)](block, prefix, out, out.numel(), c, BLOCK=cols_per_step, CP=triton.next_power_of_2(c))
