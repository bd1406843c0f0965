"""Triton kernel: the serial build's tree (kernel.py), selected level by level; opt-in (`method="levels"`).

`_build_tree_levels` (no spine) makes the serial build's choice without its `budget` pops, after
reference.select_by_levels: each level keeps the top-`budget` children of the level kept before it, ordered by
(-score, rank, parent's place), and a running best-`budget` set G absorbs each level (-score, then depth, then
place: G's nodes are shallower and win ties). Both are merges of sorted lists, so every rank is a count of
binary searches: a child (p, r) lands at p plus, for each other rank r', the r'-children of parents scoring so
that they come first (sums compared as the reference adds them, ties to the lower rank); a node of the level
lands after G's nodes not below it, a node of G after the level's nodes above it. L - 1 rounds of K - 1
searches (log2 budget + 1 steps each) replace `budget` serial reductions, and fewer: only the nodes that
entered G have children worth ranking (one G leaves out is beaten by `budget` shallower nodes, so are its
descendants), and once a level adds nothing to G the deeper ones are skipped. The layout is the serial
kernel's, on keys packed while the levels grow (depth, then the rank path with the root side most
significant). Equal to the reference on every tree shape and at the real budgets
(tests/ddtree_engine/kernels/test_tree_build.py and, on the H200, -k "real or more_warps").

Measured on the H200 (benchmarks/bench_tree_step.py, 2026-12-03 08:31 run, build alone in a CUDA graph,
serial with two pops a reduction and int32 keys): on random logits, whose trees are shallow (budget 256: 3
deep), levels at 8 warps is 1.04x the serial build at budget 256 (97.3 against 101.3 us) and slower at 64
(23.2 against 21.1); on peaked logits (one token per depth far ahead, the shape a confident drafter gives: 15
deep) it is 4-5x slower at every budget (budget 256: 409.2 against 106.0 us), since each level is a round of
searches whatever it adds. A drafter's trees are deep, so "serial" stays the default.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..gdc import gdc_enter
from .layout import _KEY_BITS, _write_keyed_tree


@triton.jit
def _count_ahead(base_ptr, n, x, STRICT: tl.constexpr, LOGB: tl.constexpr):
    """Per element of x: how many of the first n values at base_ptr (non-increasing) are > x (STRICT)
    or >= x; a binary search of LOGB steps (n < 2 ** LOGB), all elements at once."""
    lo = tl.zeros(x.shape, dtype=tl.int32)
    hi = lo + n
    for _ in range(LOGB):
        act = lo < hi
        mid = (lo + hi) >> 1
        y = tl.load(base_ptr + mid, mask=act, other=0.0)
        if STRICT:
            ahead = y > x
        else:
            ahead = y >= x
        lo = tl.where(act & ahead, mid + 1, lo)
        hi = tl.where(act & (ahead == 0), mid, hi)
    return lo


@triton.jit
def _build_tree_levels(
    vals_ptr,
    ids_ptr,
    root_ptr,
    L,
    ws_ptr,
    ws_score_ptr,
    tok_ptr,
    par_ptr,
    dep_ptr,
    rank_ptr,
    score_ptr,
    n_ptr,
    BUDGET: tl.constexpr,
    K: tl.constexpr,
    KP: tl.constexpr,
    B: tl.constexpr,
    NB: tl.constexpr,
    NP: tl.constexpr,
    COLS: tl.constexpr,
    LOGB: tl.constexpr,
    GDC: tl.constexpr = False,
):
    gdc_enter(GDC)
    # Workspace: scores (fp64) and codes (int64) of the level before and this one (2 x NB each), and of
    # the best nodes so far, G, before and after this level's merge (2 x NB each).
    GS = 2 * NB
    pi = tl.arange(0, NB)
    ri = tl.arange(0, KP)
    top = B * (L - 1)  # the rank path, root side most significant: depth 0's rank sits at bits top..top+B
    # Level 0: the root's children in rank order, the first min(K, BUDGET) of them.
    # Loop-carried scalars start as tensors (a constexpr start would change type in the loop).
    n_prev = tl.minimum(tl.program_id(0) * 0 + K, BUDGET)
    v0 = 0.0 + tl.load(vals_ptr + ri, mask=ri < n_prev, other=0.0).to(tl.float64)
    c0 = ri.to(tl.int64) << top
    tl.store(ws_score_ptr + ri, v0, mask=ri < n_prev)
    tl.store(ws_ptr + ri, c0, mask=ri < n_prev)
    tl.store(ws_score_ptr + GS + ri, v0, mask=ri < n_prev)
    tl.store(ws_ptr + GS + ri, c0, mask=ri < n_prev)  # depth 0 in the key's top bits
    n_g = n_prev
    g_off = n_prev * 0 + GS  # where G is now (it moves between its two halves with each merge)
    tl.debug_barrier()
    for d in range(1, L):
        # Only the nodes that entered G have children worth a look: a node G leaves out is beaten by BUDGET
        # shallower nodes, and so is every descendant of it. Once a level adds nothing, no deeper one can.
        if n_prev > 0:
            prev = ((d - 1) % 2) * NB  # the level before, then this one, alternate in the workspace's first 2 x NB
            cur = (d % 2) * NB
            # Candidates (p, r): child r of the level's p-th node. Each rank's column is already in the
            # level's order (-score, rank, parent's place), so a candidate's place in the merged level is p
            # plus, per other rank r', the r'-children ahead of it: a score above (r' > r) or not below
            # (r' < r) its own, one binary search in the parents' scores each.
            p2 = pi[:, None] + ri[None, :] * 0
            r2 = pi[:, None] * 0 + ri[None, :]
            # (p, r) comes after every (p', r') with p' <= p and r' <= r, so from (p + 1)(r + 1) > BUDGET on
            # it cannot be kept: no searches for it.
            ok = (p2 < n_prev) & (r2 < K) & ((p2 + 1) * (r2 + 1) <= BUDGET)
            s_par = tl.load(ws_score_ptr + prev + pi, mask=pi < n_prev, other=0.0)
            v = tl.load(vals_ptr + d * K + ri, mask=ri < K, other=0.0).to(tl.float64)
            t = s_par[:, None] + v[None, :]
            place = p2
            for rr in range(K):
                v_rr = tl.load(vals_ptr + d * K + rr).to(tl.float64)
                # #{p' : s[p'] + v_rr beats t}: s[p'] > t - v_rr is not the same in floating point, so search
                # on the sums themselves (y + v_rr against t).
                lo = tl.zeros([NB, KP], dtype=tl.int32)
                hi = lo + n_prev
                for _ in range(LOGB):
                    act = ok & (lo < hi) & (r2 != rr)
                    mid = (lo + hi) >> 1
                    y = tl.load(ws_score_ptr + prev + mid, mask=act, other=0.0) + v_rr
                    ahead = tl.where(rr < r2, y >= t, y > t)
                    lo = tl.where(act & ahead, mid + 1, lo)
                    hi = tl.where(act & (ahead == 0), mid, hi)
                place += tl.where(r2 != rr, lo, 0)
            keep = ok & (place < BUDGET)
            code_par = tl.load(ws_ptr + prev + pi, mask=pi < n_prev, other=0)
            code = code_par[:, None] | (r2.to(tl.int64) << (top - B * d))
            tl.store(ws_score_ptr + cur + place, t, mask=keep)
            tl.store(ws_ptr + cur + place, code, mask=keep)
            n_cur = tl.minimum(n_prev * K, BUDGET)
            tl.debug_barrier()
            # Merge into G (every node of it shallower, so it wins ties): the best BUDGET so far, in order.
            g_prev = g_off
            g_cur = 2 * GS + NB - g_off  # the other half of G's 2 x NB
            gs = tl.load(ws_score_ptr + g_prev + pi, mask=pi < n_g, other=0.0)
            gk = tl.load(ws_ptr + g_prev + pi, mask=pi < n_g, other=0)
            ls = tl.load(ws_score_ptr + cur + pi, mask=pi < n_cur, other=0.0)
            lk = tl.load(ws_ptr + cur + pi, mask=pi < n_cur, other=0) | ((tl.zeros([NB], dtype=tl.int64) + d) << _KEY_BITS)
            g_place = pi + _count_ahead(ws_score_ptr + cur, n_cur, gs, True, LOGB)
            l_place = pi + _count_ahead(ws_score_ptr + g_prev, n_g, ls, False, LOGB)
            g_keep = (pi < n_g) & (g_place < BUDGET)
            l_keep = (pi < n_cur) & (l_place < BUDGET)
            tl.store(ws_score_ptr + g_cur + g_place, gs, mask=g_keep)
            tl.store(ws_ptr + g_cur + g_place, gk, mask=g_keep)
            tl.store(ws_score_ptr + g_cur + l_place, ls, mask=l_keep)
            tl.store(ws_ptr + g_cur + l_place, lk, mask=l_keep)
            n_g = tl.minimum(n_g + n_cur, BUDGET)
            n_prev = tl.sum(l_keep.to(tl.int32), axis=0)  # a prefix of the level: its order is G's
            g_off = g_cur
            tl.debug_barrier()
    # G holds the choice. Layout as the serial kernel's: depth-major, then the rank path; a node's
    # place is 1 + the number of chosen keys below its own, its parent's the same for the parent's key.
    _write_keyed_tree(ws_ptr + g_off, ws_score_ptr + g_off, n_g, top, root_ptr, ids_ptr, tok_ptr, par_ptr, dep_ptr,
                      rank_ptr, score_ptr, n_ptr, BUDGET, K, B, NB, NP, COLS)
