"""Triton kernel: best-first tree build over the per-depth top-K, one program, no host sync.

The selection is the reference's heap, replayed exactly (same scores in fp64, same pops, same
tie-break: higher score, then shallower depth, then lower rank, then earlier proposal). The
heap is a register frontier indexed by *parent*: a chosen node's children are proposed one at a
time (its first child, then each chosen child proposes the next sibling), so every parent has
at most one open proposal, and the frontier needs `budget` slots (slot q holds the open child
of selection q - 1; slot 0 the root's). The key packs depth, rank, proposal counter and slot, in
int32 where they fit (`key_constants`: budget 256, K 8 does), else int64; an empty slot's key is the
largest, so it loses every comparison.

Two pops share one reduction (`_top2`): it keeps the frontier's best two (score, key), the best with
its parent's score. The first pop is the best; the second is the best of the runner-up and the two
proposals the first pop made (its next sibling and first child), compared as scalars: nothing
else in the frontier can beat the runner-up. The second pop's sibling is scored in the frontier
(its slot's parent score + value), so the runner-up's parent score stays out of the reduction.
Each pop writes its sibling back into its own slot
and its first child into slot `chosen + 1`, with `tl.where`, no gather. Spine steps take their
slot (the previous spine node's child) without a reduction. Measured on the H200 (2026-12-03, build
alone in a CUDA graph, trees equal to the one-pop loop's; a scratch sweep, figures in the README):
budget 256 108.4 us against 124.6 for one pop a reduction, 64 23.6 against 25.2, 15 9.9 against 10.1;
with int32 keys and the runner-up's parent score out of the reduction 100.8, 21.5 and 9.7 (a later sweep,
same day, the two-pops build measured 108.3, 23.6, 9.9 beside it).
Tried in the same sweep and slower: the warps' partial bests through a global scratch with one barrier
instead of Triton's shared-memory exchange (143 us at 256, one pop a reduction), and the value loads
issued one pop ahead (126.8); with no value loads at all the loop is only 8 us faster (116.9).
Four pops a reduction (the frontier's best four by a bitonic merge, the round's later pops chosen among them
and the earlier pops' proposals in a scalar sorted list) gave the same trees and was slower: 109.3 us at 256
against 100.8, 23.4 at 64 against 21.5 (H200 2026-12-03 11:01, benchmarks/results/
build_four_pops_sweep_20261203.json). Triton reduces a tuple across warps one value at a time (a store, a
barrier and a load each), and a two-pop round is a chain of such latencies: ~390 sm_90 instructions, ~0.7 us.
A sorted frontier instead of the heap (the head in registers, the rest sorted in a global double buffer, no
reduction; H200 2026-12-04, benchmarks/results/build_sorted_frontier_20261204.json) gave the same trees and was
98.5 us at 256 against 101.4, slower at 64 (30.0 against 21.7) and 15 (11.6 against 8.9): a pop is ~0.3 us of
dependent scalar steps either way (its loop without barriers or value loads is only 11 % faster).
The reduction narrowed (the two int32 keys in one int64: 4 values; and the parent score from a mirrored workspace
row: 3) gave the same trees and was slower too: 103.7 and 102.6 us at 256 against 100.9 (H200 2026-12-04,
benchmarks/results/build_packed_reduction_20261204.json).
No pops at all (the prefixes with D = sum_j prod_{i<=j} (r_i + 1) <= budget, a fixed set per shape: 293 at budget
15 with K 8, but 892,786 at 256; scored at once, cut at the budget-th best by tl.topk, a boundary tie sent to this
build) gave the same trees and was slower at the budgets it fits: 11.2 us at 15 against 9.1, 14.9 at 22 against 11.3
(H200 2026-12-04, benchmarks/results/build_static_candidates_20261204.json; README "A selection with no pops at all").
A threshold selection (enumerate the prefixes scoring at least a lower bound of the budget-th best score, level
by level with no ranking, then cut at the pool's budget-th best by a radix select) chose the same sets, ties
flagged, in 30-53 us at budget 256 against this build's 97 on fp64 inputs (selection alone, a prototype: H200
2026-12-04, benchmarks/results/build_threshold_20261204.json), but the step was slower on bf16 logits (238 against
121 us at 256), whose equal log-probs put a tie at the boundary in most draws and so ran this build after it
(build_threshold_step_20261204.*; README "A threshold selection"). Cutting such a tie by the heap's order itself
(threshold.py, method "threshold"), it is TreeStep's build from budget 128: the step 51.1-58.8 us at 256 against
this build's 121.8-125.3 and 40.4-56.4 at 128 against 72.8-77.6 on 7 bf16 draws, mixed at 64
(build_threshold_cut2_20261204.*; README "The threshold build").

After the loop (`budget` pops, fixed), the chosen nodes are laid out depth-major (layout.py), the rank
path of each read off the workspace's parent links: by pointer jumping in registers up to NB 32 on one warp
(`_layout`'s LJ, LAYOUT_JUMPS_UP_TO), else by a climb a level at a time. On one warp the pops take their values from
the [L, K] table read once into registers (`_value`, VALUE_TABLE_UP_TO), keep the chosen nodes in registers where the
layout jumps (CHOSEN_IN_REGISTERS), and up to budget 32 `_build_compile_tree` compiles the tree in the same launch
(`compiles_in_build`; README "The serial build's values table").

`method="levels"` (levels.py: `_build_tree_levels`, no spine) makes the same choice level by level;
faster on shallow trees only, so "serial" stays the default.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..gdc import gdc_enter, launch_options
from .layout import _KEY_BITS, _NONE, _count_below, _write_nodes
from .levels import _build_tree_levels
from .shapes import KEY_BITS, MAX_BUDGET_AND_K, rank_bits, supports
from ..tree_mask.kernel import _compile_chosen

# The empty frontier slot's key in the int32 layout; the kernel reads the key type off it (else int64).
_KNONE32 = tl.constexpr(2**31 - 1)


@triton.jit
def _before(s1, k1, s2, k2):
    """Whether the frontier entry (s1, k1) pops before (s2, k2): the higher score, then the lower key."""
    return (s1 > s2) | ((s1 == s2) & (k1 < k2))


@triton.jit
def _top2(a1s, a1k, a1p, a2s, a2k, b1s, b1k, b1p, b2s, b2k):
    """Combine two (best, runner-up) pairs, each in pop order (`_before`), into the best two: (score, key, parent
    score) of the best, (score, key) of the runner-up (a second pop's sibling is scored in the frontier, not as
    a scalar)."""
    a_first = _before(a1s, a1k, b1s, b1k)
    # The runner-up: a's second against b's first, or a's first against b's second.
    xs = tl.where(a_first, a2s, a1s)
    xk = tl.where(a_first, a2k, a1k)
    ys = tl.where(a_first, b1s, b2s)
    yk = tl.where(a_first, b1k, b2k)
    x_first = _before(xs, xk, ys, yk)
    return (tl.where(a_first, a1s, b1s), tl.where(a_first, a1k, b1k), tl.where(a_first, a1p, b1p),
            tl.where(x_first, xs, ys), tl.where(x_first, xk, yk))


@triton.jit
def _value(vals_ptr, tab, idx, ok, TP: tl.constexpr):
    """vals[idx] where ok, else 0.0: a `tl.gather` from the [L, K] table read once into registers (TP > 0: one round of
    warp shuffles on one warp) or a load (an L2 round trip where the line is new to the pops)."""
    if TP > 0:
        at = tl.minimum(tl.maximum(tl.zeros([1], dtype=tl.int32) + idx, 0), TP - 1)
        v = tl.where(ok, tl.sum(tl.gather(tab, at, 0), axis=0), 0.0)
    else:
        v = tl.load(vals_ptr + idx, mask=ok, other=0.0)
    return v


@triton.jit
def _propose(s, key, pscore, c, counter, active, vals_ptr, ws_ptr, ws_score_ptr, L, K: tl.constexpr, NB: tl.constexpr,
             SD: tl.constexpr, SR: tl.constexpr, SC: tl.constexpr, KNONE: tl.constexpr, tab, TP: tl.constexpr, chosen,
             RC: tl.constexpr):
    """Choose the node (s, key) whose parent scores `pscore` as selection c (if active): record it (in the workspace,
    or with RC in the registers `chosen`: [NB] vectors of parent selection, depth, rank and score by selection, and by
    frontier slot the first node popped from it, the parent's first child, and how many were), and make its two
    proposals as scalars, its next sibling (same slot q; also its value, for a score taken in the frontier) and its
    first child (slot c + 1). The key is depth << SD | rank << SR | counter << SC | slot."""
    kt = key.dtype
    d = (key >> SD).to(tl.int32)
    r = ((key >> SR) & ((1 << (SD - SR)) - 1)).to(tl.int32)
    q = (key & ((1 << SC) - 1)).to(tl.int32)
    if RC:
        cp, cd, cr, cs, first, kids = chosen
        lane = tl.arange(0, NB)
        at = active & (lane == c)
        at_q = active & (lane == q)
        chosen = (tl.where(at, q - 1, cp), tl.where(at, d, cd), tl.where(at, r, cr), tl.where(at, s, cs),
                  tl.where(at_q & (r == 0), c, first), kids + at_q.to(tl.int32))
    else:
        tl.store(ws_ptr + c, q - 1, mask=active)
        tl.store(ws_ptr + NB + c, d, mask=active)
        tl.store(ws_ptr + 2 * NB + c, r, mask=active)
        tl.store(ws_score_ptr + c, s, mask=active)
    has_sib = active & (r + 1 < K)
    v_sib = _value(vals_ptr, tab, d * K + r + 1, has_sib, TP)
    sib_s = tl.where(has_sib, pscore + v_sib, float("-inf"))
    sib_k = tl.where(has_sib, (d.to(kt) << SD) | ((r + 1).to(kt) << SR) | (counter << SC) | q.to(kt), KNONE)
    counter += has_sib.to(kt)
    has_child = active & (d + 1 < L)
    v_child = _value(vals_ptr, tab, (d + 1) * K, has_child, TP)
    child_s = tl.where(has_child, s + v_child, float("-inf"))
    child_k = tl.where(has_child, ((d + 1).to(kt) << SD) | (counter << SC) | (c + 1).to(kt), KNONE)
    counter += has_child.to(kt)
    return q, has_sib, v_sib, sib_s, sib_k, has_child, child_s, child_k, counter, chosen


@triton.jit
def _place(f_score, f_pscore, f_key, slot, active, q, sib_s, sib_k, has_child, c, child_s, child_k, s):
    """A chosen node's proposals into the frontier: its sibling (or nothing) into its slot q, its first child
    into slot c + 1 with the node's score as the child's parent score."""
    at_q = active & (slot == q)
    f_score = tl.where(at_q, sib_s, f_score)
    f_key = tl.where(at_q, sib_k, f_key)
    at_c = has_child & (slot == c + 1)
    f_score = tl.where(at_c, child_s, f_score)
    f_pscore = tl.where(at_c, s, f_pscore)
    f_key = tl.where(at_c, child_k, f_key)
    return f_score, f_pscore, f_key


@triton.jit
def _select(vals_ptr, L, spine, ws_ptr, ws_score_ptr, BUDGET: tl.constexpr, K: tl.constexpr, NB: tl.constexpr,
            SD: tl.constexpr, SR: tl.constexpr, SC: tl.constexpr, KNONE: tl.constexpr, TP: tl.constexpr = 0,
            RC: tl.constexpr = False):
    """The heap's pops (the spine's first): selection c's parent selection, depth, rank at ws_ptr + c, NB + c,
    2 * NB + c and its score at ws_score_ptr + c, or with RC at c of [NB] vectors in registers. Returns how many
    nodes it chose (the budget, or fewer where the candidates ran out) and those vectors (`_propose`; their starting
    values unless RC)."""
    slot = tl.arange(0, NB)
    KT = tl.int32 if KNONE == _KNONE32 else tl.int64  # the frontier's keys (key_constants: int32 where they fit)
    if TP > 0:  # the [L, K] values read once, each pop's two taken from them (`_value`, `value_table`)
        ti = tl.arange(0, TP)
        tab = tl.load(vals_ptr + ti, mask=ti < L * K, other=float("-inf"))
    else:
        tab = tl.zeros([1], dtype=tl.float64)  # unused: the pops load their values
    # Slot 0: the root's first child (depth 0, rank 0, counter 0).
    v00 = _value(vals_ptr, tab, 0, True, TP).to(tl.float64)
    f_score = tl.where(slot == 0, 0.0 + v00, float("-inf"))
    f_pscore = tl.zeros([NB], dtype=tl.float64)
    f_key = tl.where(slot == 0, 0, KNONE).to(KT)
    none_score = tl.full([NB], float("-inf"), tl.float64)
    none_key = tl.full([NB], KNONE, KT)
    chosen = (tl.full([NB], -1, tl.int32), tl.zeros([NB], dtype=tl.int32), tl.zeros([NB], dtype=tl.int32),
              tl.zeros([NB], dtype=tl.float64), tl.full([NB], -1, tl.int32), tl.zeros([NB], dtype=tl.int32))
    # Loop-carried scalars start as tensors (a constexpr start would change type in the loop).
    zero = tl.program_id(0) * 0
    counter = (zero + 1).to(KT)
    n_chosen = zero
    spine_score = zero.to(tl.float64)
    for it in range(spine):
        # A spine step takes slot `it` (the previous spine node's child) whatever the heap says.
        s = spine_score + _value(vals_ptr, tab, it * K, True, TP)
        key = ((zero + it).to(KT) << SD) | (zero + it).to(KT)
        q, _, _, sib_s, sib_k, has_child, child_s, child_k, counter, chosen = _propose(
            s, key, spine_score, n_chosen, counter, zero == 0, vals_ptr, ws_ptr, ws_score_ptr, L, K, NB, SD, SR, SC,
            KNONE, tab, TP, chosen, RC)
        f_score, f_pscore, f_key = _place(f_score, f_pscore, f_key, slot, zero == 0, q, sib_s, sib_k, has_child,
                                          n_chosen, child_s, child_k, s)
        spine_score = s
        n_chosen += 1
    for it in range(spine, BUDGET, 2):
        # The best two of the frontier, the best with its parent's score (its sibling's is parent + value).
        s1, k1, p1, s2, k2 = tl.reduce((f_score, f_key, f_pscore, none_score, none_key), 0, _top2)
        act1 = k1 != KNONE
        c1 = n_chosen
        q1, _, _, sib1_s, sib1_k, hc1, ch1_s, ch1_k, counter, chosen = _propose(
            s1, k1, p1, c1, counter, act1, vals_ptr, ws_ptr, ws_score_ptr, L, K, NB, SD, SR, SC, KNONE, tab, TP,
            chosen, RC)
        n_chosen += act1.to(tl.int32)
        # The second pop: the runner-up, or one of the first pop's proposals if it beats it.
        take = _before(sib1_s, sib1_k, s2, k2)
        s2 = tl.where(take, sib1_s, s2)
        k2 = tl.where(take, sib1_k, k2)
        take = _before(ch1_s, ch1_k, s2, k2)
        s2 = tl.where(take, ch1_s, s2)
        k2 = tl.where(take, ch1_k, k2)
        act2 = (it + 1 < BUDGET) & (k2 != KNONE)
        c2 = n_chosen
        q2, hs2, v_sib2, _, sib2_k, hc2, ch2_s, ch2_k, counter, chosen = _propose(
            s2, k2, s2, c2, counter, act2, vals_ptr, ws_ptr, ws_score_ptr, L, K, NB, SD, SR, SC, KNONE, tab, TP,
            chosen, RC)
        n_chosen += act2.to(tl.int32)
        # In pop order: the second pop may have taken a slot the first just wrote, so its sibling is scored
        # on the frontier's parent scores after the first pop's writes.
        f_score, f_pscore, f_key = _place(f_score, f_pscore, f_key, slot, act1, q1, sib1_s, sib1_k, hc1, c1, ch1_s,
                                          ch1_k, s1)
        sib2_s = tl.where(hs2, f_pscore + v_sib2, float("-inf"))
        f_score, f_pscore, f_key = _place(f_score, f_pscore, f_key, slot, act2, q2, sib2_s, sib2_k, hc2, c2, ch2_s,
                                          ch2_k, s2)
    return n_chosen, chosen


@triton.jit
def _layout(ws_ptr, n_chosen, chosen, L, B: tl.constexpr, NB: tl.constexpr, COLS: tl.constexpr, LJ: tl.constexpr,
            RC: tl.constexpr):
    """The chosen nodes' layout: depth-major, then the rank path; a node's place = 1 + #(smaller keys). Each chosen
    node's rank path (its own rank lowest, B bits a level) by pointer jumping in registers where LJ > 0: after round
    j a node's code holds the ranks of its 2^(j+1) nearest chain nodes; LJ rounds (2^LJ >= NB >= any depth). Else by a
    climb through the workspace, a level a step (two loads). Places by the count over the keys read back from the
    workspace (at ws_ptr + 3 * NB; an [NB, NB] compare of the int64 keys in registers took ~700 warp shuffles at NB 16
    in the sm_90 code), parents' places by a gather (jumping) or through the workspace (climbing).
    The chosen nodes' parent selection, depth and rank from `_select`'s vectors (RC) or the workspace.
    Returns, per selection index: (chosen, place, parent's place, depth, rank)."""
    ci = tl.arange(0, NB)
    cm = ci < n_chosen
    if RC:
        par = tl.where(cm, chosen[0], -1)
        dep = tl.where(cm, chosen[1], 0)
        rnk = tl.where(cm, chosen[2], 0)
    else:
        par = tl.load(ws_ptr + ci, mask=cm, other=-1)
        dep = tl.load(ws_ptr + NB + ci, mask=cm, other=0)
        rnk = tl.load(ws_ptr + 2 * NB + ci, mask=cm, other=0)
    code = rnk.to(tl.int64)
    if LJ > 0:
        up = par.to(tl.int32)
        for j in tl.static_range(LJ):
            if B * (1 << j) < _KEY_BITS:  # no chain is deeper (supports(): B * L <= KEY_BITS), nor a shift past 63
                has = cm & (up >= 0)
                at = tl.maximum(up, 0)
                code = code | tl.where(has, tl.gather(code, at, 0) << (B * (1 << j)), 0)
                up = tl.where(has, tl.gather(up, at, 0), -1)
    else:
        up = par
        for step in range(1, L):
            has = cm & (up >= 0)
            code = code | (tl.load(ws_ptr + 2 * NB + up, mask=has, other=0).to(tl.int64) << (B * step))
            up = tl.load(ws_ptr + up, mask=has, other=-1)
    key = (dep.to(tl.int64) << _KEY_BITS) | code
    tl.store(ws_ptr + 3 * NB + ci, key, mask=cm)
    tl.debug_barrier()
    # The rows' keys read back as a column ([NB, 1]), so the count compares tiles of the layout they are
    # loaded in (expanding the 1-D keys instead cost 17 us at budget 256: _count_below).
    place = _count_below(ws_ptr + 3 * NB, n_chosen, tl.load(ws_ptr + 3 * NB + ci[:, None], mask=cm[:, None], other=_NONE),
                         NB, COLS).to(tl.int64) + 1
    if LJ > 0:
        par_place = tl.where(cm & (par >= 0), tl.gather(place, tl.maximum(par, 0).to(tl.int32), 0), 0)
    else:
        tl.store(ws_ptr + 4 * NB + ci, place, mask=cm)
        tl.debug_barrier()
        par_place = tl.load(ws_ptr + 4 * NB + par, mask=cm & (par >= 0), other=0)
    return cm, place, par_place, dep, rnk


@triton.jit
def _build_tree(
    vals_ptr,
    ids_ptr,
    root_ptr,
    L,
    spine,
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
    B: tl.constexpr,
    NB: tl.constexpr,
    NP: tl.constexpr,
    COLS: tl.constexpr,
    SD: tl.constexpr,
    SR: tl.constexpr,
    SC: tl.constexpr,
    KNONE: tl.constexpr,
    GDC: tl.constexpr = False,
    LJ: tl.constexpr = 0,
    TP: tl.constexpr = 0,
    RC: tl.constexpr = False,
):
    gdc_enter(GDC)
    _build(vals_ptr, ids_ptr, root_ptr, L, spine, ws_ptr, ws_score_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr, score_ptr,
           n_ptr, BUDGET, K, B, NB, NP, COLS, SD, SR, SC, KNONE, LJ, TP, RC)


@triton.jit
def _build(vals_ptr, ids_ptr, root_ptr, L, spine, ws_ptr, ws_score_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr, score_ptr,
           n_ptr, BUDGET: tl.constexpr, K: tl.constexpr, B: tl.constexpr, NB: tl.constexpr, NP: tl.constexpr,
           COLS: tl.constexpr, SD: tl.constexpr, SR: tl.constexpr, SC: tl.constexpr, KNONE: tl.constexpr,
           LJ: tl.constexpr, TP: tl.constexpr, RC: tl.constexpr):
    """`_build_tree`'s work, the pops, the layout and the tree's arrays. Returns, per selection index, what the build
    that compiles the tree too reads: (how many, chosen, `_select`'s vectors, place, parent's place)."""
    tl.static_assert(LJ > 0 or not RC, "the chosen nodes stay in registers (RC) only where the layout jumps (LJ > 0)")
    n_chosen, chosen = _select(vals_ptr, L, spine, ws_ptr, ws_score_ptr, BUDGET, K, NB, SD, SR, SC, KNONE, TP, RC)
    ci = tl.arange(0, NB)
    if RC:  # the chosen nodes in registers: their tokens' loads issued before the layout
        cm = ci < n_chosen
        tok = tl.load(ids_ptr + chosen[1] * K + chosen[2], mask=cm, other=0)
        score = tl.where(cm, chosen[3], 0.0)
    else:
        tl.debug_barrier()
    cm, place, par_place, dep, rnk = _layout(ws_ptr, n_chosen, chosen, L, B, NB, COLS, LJ, RC)
    if not RC:
        tok = tl.load(ids_ptr + dep * K + rnk, mask=cm, other=0)
        score = tl.load(ws_score_ptr + ci, mask=cm, other=0.0)
    _write_nodes(place, par_place, dep, rnk, tok, score, cm, n_chosen, root_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr,
                 score_ptr, n_ptr, BUDGET, NP)
    return n_chosen, cm, chosen, place, par_place


@triton.jit
def _build_compile_tree(
    vals_ptr, ids_ptr, root_ptr, L, spine, ws_ptr, ws_score_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr, score_ptr, n_ptr,
    prefix_ptr, mask_ptr, packed_ptr, pos_ptr, fc_ptr, ns_ptr,
    BUDGET: tl.constexpr, K: tl.constexpr, B: tl.constexpr, NB: tl.constexpr, NP: tl.constexpr, COLS: tl.constexpr,
    SD: tl.constexpr, SR: tl.constexpr, SC: tl.constexpr, KNONE: tl.constexpr, LJ: tl.constexpr, TP: tl.constexpr,
    W: tl.constexpr, GDC: tl.constexpr = False,
):
    """`_build_tree` with its layout by jumps and its chosen nodes in registers, then the tree's compile
    (tree_mask.kernel._compile_chosen) from those registers: the step's compile launch saved."""
    gdc_enter(GDC)
    n_chosen, cm, chosen, place, par_place = _build(
        vals_ptr, ids_ptr, root_ptr, L, spine, ws_ptr, ws_score_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr, score_ptr,
        n_ptr, BUDGET, K, B, NB, NP, COLS, SD, SR, SC, KNONE, LJ, TP, True)
    _compile_chosen(n_chosen, cm, place, chosen, prefix_ptr, mask_ptr, packed_ptr, pos_ptr, fc_ptr, ns_ptr, BUDGET + 1,
                    W, NB, NP, LJ)


# Budgets from which the build kernel takes 4 warps. Measured on the H200 in a CUDA graph
# (benchmarks/bench_tree_step.py, 2026-12-03 08:31, two pops a reduction, int32 keys): budget 64 21.0 us at
# 1 warp, 27.5 at 2, 26.3 at 4; budget 256 118.3 us at 1 warp, 124.0 at 2, 101.2 at 4, 117.9 at 8 (2026-12-01,
# one pop a reduction: 64 28.4 at 1, 30.8 at 4; 256 269.5 at 1, 131.2 at 4). The heap lives in a global
# workspace the warps share: 2, 4 and 8 warps gave the reference's trees on every tree shape, random shapes
# up to budget 300 and the real budgets on the H200 (tests/ddtree_engine/kernels/test_tree_build.py -k
# more_warps, 2026-12-01, and with this loop 2026-12-03).
MANY_WARPS_FROM_BUDGET = 128
THRESHOLD_WARPS = 8  # the threshold build's (method "threshold")


def default_warps(budget: int) -> int:
    """Warps of the build kernel's one program (the measurements above).

    Args:
        budget: drafted nodes.

    Returns:
        1 up to budget 127, 4 from 128 (`MANY_WARPS_FROM_BUDGET`).
    """
    return 4 if budget >= MANY_WARPS_FROM_BUDGET else 1


def build_tree_arrays(
    vals: torch.Tensor,
    ids: torch.Tensor,
    budget: int,
    root: torch.Tensor,
    spine_depth: int = 0,
    out: tuple[torch.Tensor, ...] | None = None,
    num_warps: int | None = None,
    method: str = "serial",
    key_layout: dict | None = None,
    fell_back: torch.Tensor | None = None,
    pdl: bool | None = None,
    compiled: tuple[torch.Tensor, ...] | None = None,
    prefix_len: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The draft tree over the per-depth top-K, fixed shape N = budget + 1 (Triton).

    Args:
        vals: [L, K] float64 per-depth log-probs, best first, -inf allowed and no NaN (topk_logprobs gives none:
            it counts a NaN logit as -inf; fed NaN, the levels builds made nodes their own parents); ids: [L, K]
            int64 token ids.
        budget: drafted nodes, >= 1.
        root: [1] int64 on vals' device, the root token (read by the kernel: no host sync).
        spine_depth: reserve the top-1 chain down to this depth first (capped by L, budget).
        out: optional (tokens, parents, depths, ranks, scores, num_nodes) buffers to fill.
        num_warps: warps of the single program; None takes `default_warps(budget)`.
        method: "serial", the heap replayed pop by pop (`budget` steps), or "levels", the same choice
            level by level (`_build_tree_levels`: L - 1 merges of ranked candidates, no spine; with
            spine_depth > 0 it builds "serial"). Faster on shallow trees only (levels.py), so not the default.
            Or "threshold", the prefixes scoring above a bound of the budget-th best (threshold.py; spines and
            shapes it does not take, `threshold_fits`, are built "serial", and so are rows with a positive log-prob
            and large ties at the cut, in the same launch).
        key_layout: the serial build's frontier key layout: None or `key_constants(budget, K)` (int32 where its
            fields fit), or `INT64_KEYS` at any shape (the tests run both); not with method "levels".
        fell_back: optional [1] int64 on vals' device; method "threshold" writes 1 there when it built the tree
            serially instead (a spine, a shape it does not take, a large tie; the tests check where), 0 when by its
            threshold; other methods leave it.
        pdl: launch with programmatic dependent launch (kernels/gdc.py; None: DDTREE_PDL, else gdc.DEFAULT).
        compiled: (mask [N, N] bool, packed [N, ceil(N / 32)] int32, positions, first_child, next_sibling [N]
            int64) buffers the same launch fills with the tree's compile (tree_mask.compile_tree_arrays' arrays) from
            its registers (`_build_compile_tree`): only where `compiles_in_build` says so.
        prefix_len: [1] int64 on vals' device, the root's position; with `compiled` only.

    Returns:
        (tokens, parents, depths, ranks [N] int64, scores [N] float64, num_nodes [1] int64),
        as tree_build.reference.build_tree_arrays.
    """
    if vals.dim() != 2 or vals.shape != ids.shape:
        raise ValueError(f"expected vals and ids [L, K] alike, got {tuple(vals.shape)} and {tuple(ids.shape)}")
    if vals.dtype != torch.float64 or ids.dtype != torch.int64:
        raise ValueError(f"expected float64 vals and int64 ids, got {vals.dtype} and {ids.dtype}")
    depths, k = vals.shape
    if budget < 1 or depths < 1:
        raise ValueError(f"expected budget >= 1 and L >= 1, got budget {budget}, L {depths}")
    if not supports(depths, k, budget):
        raise ValueError(f"expected ceil(log2 K) * L <= {KEY_BITS}, budget and K < {MAX_BUDGET_AND_K}, got L {depths}, K {k}")
    if root.numel() != 1 or root.device != vals.device:
        raise ValueError(f"expected a one-element root tensor on {vals.device}, got {tuple(root.shape)} on {root.device}")
    if fell_back is not None and (fell_back.shape != (1,) or fell_back.dtype != torch.int64 or fell_back.device != vals.device):
        raise ValueError(f"expected fell_back a [1] int64 tensor on {vals.device}, got {tuple(fell_back.shape)} "
                         f"{fell_back.dtype} on {fell_back.device}")
    if method not in ("serial", "levels", "threshold"):
        raise ValueError(f"expected method 'serial', 'levels' or 'threshold', got {method!r}")
    if key_layout is not None and (method == "levels" or key_layout not in (INT64_KEYS, key_constants(budget, k))):
        raise ValueError(f"expected key_layout None, key_constants({budget}, {k}) or INT64_KEYS with method 'serial', "
                         f"got {key_layout} with method {method!r}")
    device = vals.device
    n_out = budget + 1
    if compiled is not None:
        _check_compiled(compiled, prefix_len, n_out, device)
        if num_warps not in (None, 1) or not compiles_in_build(budget, k, method):
            raise ValueError(f"the build compiles the tree itself (compiled=) only where compiles_in_build says so: "
                             f"method 'serial' on one warp, budget up to {LAYOUT_JUMPS_UP_TO}; got method {method!r}, "
                             f"budget {budget}, num_warps {num_warps}")
    elif prefix_len is not None:
        raise ValueError("prefix_len goes with compiled= (the build's own compile)")
    if out is None:
        out = (
            *(torch.empty(n_out, dtype=torch.int64, device=device) for _ in range(4)),
            torch.empty(n_out, dtype=torch.float64, device=device),
            torch.empty(1, dtype=torch.int64, device=device),
        )
    spine = min(spine_depth, depths, budget)
    levels = method == "levels" and spine == 0
    tshape = _threshold_shape(budget, k, depths) if method == "threshold" and spine == 0 else None
    threshold = tshape is not None
    inputs = (vals.contiguous(), ids.contiguous(), root.to(torch.int64), depths)
    # The threshold build's vectors are wide (a level's 256 x 8 children, 4,096 pool keys): 8 warps (H200
    # 2026-12-04, benchmarks/results/build_threshold_20261204.json: 50.2 us at budget 256 against 77.9 at 4).
    warps = num_warps or (THRESHOLD_WARPS if threshold else default_warps(budget))
    shape = dict(launch_constants(budget, k, levels), num_warps=warps)
    if key_layout is not None:
        shape.update(key_layout)
    ws, ws_score = workspaces(budget, levels, device)
    gdc = launch_options(vals, pdl)
    if threshold:
        from .threshold import _build_tree_threshold  # threshold.py imports this module

        tsize = 2 * tshape["CAPT"] + triton.next_power_of_2(budget) + tshape["TC"] + 1
        tws = torch.empty(tsize, dtype=torch.int64, device=device)
        tws_score = torch.empty(tsize, dtype=torch.float64, device=device)
        flag = tws[-1:] if fell_back is None else fell_back
        _build_tree_threshold[(1,)](*inputs, spine, ws, ws_score, tws, tws_score, *out, flag, **shape, **tshape, **gdc)
    elif levels:
        _build_tree_levels[(1,)](*inputs, ws, ws_score, *out, **shape, **gdc)
    elif compiled is not None:
        _build_compile_tree[(1,)](*inputs, spine, ws, ws_score, *out, prefix_len, *compiled, **shape, **gdc,
                                  LJ=layout_jumps(shape["NB"], warps), TP=value_table(depths, k, warps),
                                  W=compiled[1].shape[1])
    else:
        _build_tree[(1,)](*inputs, spine, ws, ws_score, *out, **shape, **gdc, LJ=layout_jumps(shape["NB"], warps),
                          TP=value_table(depths, k, warps),
                          RC=CHOSEN_IN_REGISTERS and layout_jumps(shape["NB"], warps) > 0)
        if method == "threshold" and fell_back is not None:
            fell_back.fill_(1)  # a spine, or a shape the threshold build does not take (threshold_fits)
    return out


# NB (the budget to a power of two) up to which the serial build lays its chosen nodes out by pointer jumping in
# registers (`_build_tree`'s LJ, `_layout`) on one warp, instead of a climb a step through the workspace. H100
# 2026-12-06, the step with the walk in CUDA graphs (PDL), medians of 7 interleaved rounds, a flat and a deep draw
# (benchmarks/results/layout_compile_20261206.py, _h100.txt): budget 15 -0.29 / -1.15 us, 22 -0.20 / -1.73, 32 -0.54 /
# +0.19, 48 -0.13 / +0.07 (jumping to 64 there); so up to NB 32.
LAYOUT_JUMPS_UP_TO = 32


def layout_jumps(nb: int, warps: int) -> int:
    """`_build_tree`'s LJ: log2(NB) pointer-jumping rounds for the layout where NB <= LAYOUT_JUMPS_UP_TO on one warp,
    else 0 (the climb through the workspace)."""
    return max(nb.bit_length() - 1, 1) if nb <= LAYOUT_JUMPS_UP_TO and warps == 1 else 0


# L * K (to a power of two) up to which the serial build's pops take their values from the [L, K] table read once into
# registers, by a gather (`_select`'s TP, `_value`) on one warp, instead of a load each that waits on the pop before.
# H200 2026-12-06, the step with the walk in CUDA graphs (PDL), medians of 7 interleaved rounds, L 15, K 8 (a table of
# 128), a flat and a deep draw (benchmarks/results/value_table_20261206_modes_h200.txt): budget 15 -0.23 / -2.24 us, 22
# -1.15 / -2.15, 32 -0.80 / -2.11. Slower there: the values by a select and max over the table (+2.2 / +0.6 us at
# 15) and loads after the table was read once into L1 (-0.26 / -0.93). Larger tables (K 16: 256) not timed.
VALUE_TABLE_UP_TO = 128
# Whether the serial build keeps its chosen nodes in registers where it lays them out by jumps (`_select`'s RC).
CHOSEN_IN_REGISTERS = True


def value_table(depths: int, k: int, warps: int) -> int:
    """`_build_tree`'s TP: the [L, K] table's size to a power of two where it is at most VALUE_TABLE_UP_TO and the
    build runs on one warp, else 0 (a load a value)."""
    size = triton.next_power_of_2(depths * k)
    return size if size <= VALUE_TABLE_UP_TO and warps == 1 else 0


# Whether the serial build compiles the tree itself where it can (`compiles_in_build`), TreeStep's default there.
COMPILE_IN_BUILD = True


def compiles_in_build(budget: int, k: int, method: str = "serial") -> bool:
    """Whether `build_tree_arrays` takes compiled= at this shape: the serial build (method "serial"; a spine too) on
    one warp with its layout by jumps (`layout_jumps`: budgets up to LAYOUT_JUMPS_UP_TO, at most 33 rows), k >= 1."""
    return (method == "serial" and budget >= 1 and k >= 1
            and layout_jumps(triton.next_power_of_2(budget), default_warps(budget)) > 0)


def _check_compiled(compiled, prefix_len, n_out: int, device) -> None:
    """compiled= and prefix_len= as `build_tree_arrays` takes them, else a ValueError saying what differs."""
    words = triton.cdiv(n_out, 32)
    want = (((n_out, n_out), torch.bool), ((n_out, words), torch.int32), *(((n_out,), torch.int64),) * 3)
    got = tuple((tuple(t.shape), t.dtype) for t in compiled) if len(compiled) == 5 else None
    if got != want or any(t.device != device or not t.is_contiguous() for t in compiled):
        raise ValueError(f"expected compiled = (mask, packed, positions, first_child, next_sibling), contiguous on "
                         f"{device}, shaped {want}, got {got or len(compiled)}")
    if prefix_len is None or prefix_len.numel() != 1 or prefix_len.device != device:
        raise ValueError(f"expected prefix_len a one-element tensor on {device} with compiled=, got "
                         f"{None if prefix_len is None else (tuple(prefix_len.shape), prefix_len.device)}")


def threshold_fits(budget: int, k: int, depths: int) -> bool:
    """Whether method "threshold" builds this shape by its threshold (tree_build/threshold.py `fitting_constants`);
    it builds the others serially."""
    return _threshold_shape(budget, k, depths) is not None


def _threshold_shape(budget: int, k: int, depths: int) -> dict | None:
    from .threshold import fitting_constants  # threshold.py imports this module

    return fitting_constants(budget, k, depths)


def launch_constants(budget: int, k: int, levels: bool) -> dict:
    """The build kernels' constexprs at (budget, K); tree_step's one-launch kernel takes both sets.

    Args:
        budget: drafted nodes; k: candidates per depth.
        levels: the levels build's constants instead of the serial build's.

    Returns:
        dict(BUDGET, K, B: rank bits, NB: budget to a power of two, NP: budget + 1 to a power of two, COLS: the
        layout count's tile), plus `key_constants` for the serial build or KP and LOGB for the levels build.
    """
    nb = triton.next_power_of_2(budget)
    consts = dict(BUDGET=budget, K=k, B=rank_bits(k), NB=nb, NP=triton.next_power_of_2(budget + 1), COLS=min(nb, 16))
    if levels:
        consts.update(KP=triton.next_power_of_2(k), LOGB=nb.bit_length())
    else:
        consts.update(key_constants(budget, k))
    return consts


def key_constants(budget: int, k: int) -> dict:
    """The serial build's frontier key layout, depth << SD | rank << SR | counter << SC | slot.

    int32 where slots up to next_power_of_2(budget), counters up to 2 * budget + 1, ranks up to K - 1 and
    depths up to 63 fit in 31 bits (budget 256, K 8: 9 + 10 + 3 + 6), else int64 (`INT64_KEYS`: 12, 20, 12 bits
    and the depth above). The int32 key: H200 2026-12-03, build alone in a CUDA graph, with the runner-up's
    parent score left out of the reduction: budget 256 100.8 us against 108.3, 64 21.5 against 23.6, 15 9.7
    against 9.9.

    Args:
        budget: drafted nodes; k: candidates per depth.

    Returns:
        dict(SD, SR, SC: the fields' shifts, KNONE: the empty slot's key, the largest of the key type;
        2**31 - 1 (`_KNONE32`) tells the kernel the keys are int32).
    """
    nb = triton.next_power_of_2(budget)
    sc = nb.bit_length()
    sr = sc + (2 * budget + 2).bit_length()
    sd = sr + rank_bits(k)
    if sd + 6 <= 31:
        return dict(SD=sd, SR=sr, SC=sc, KNONE=_KNONE32.value)
    return dict(INT64_KEYS)


# The int64 frontier key (supports(): budget and K below 4096): slot 12 bits, counter 20, rank 12, depth above.
INT64_KEYS = dict(SD=44, SR=32, SC=12, KNONE=2**63 - 1)


def workspaces(budget: int, levels: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The build's global workspace, NB = budget to a power of two.

    Args:
        budget: drafted nodes; levels: for the levels build; device: where to allocate.

    Returns:
        (int64, float64) tensors: the serial heap's chosen nodes, layout keys and places (5 x NB) and scores
        (NB), or the levels build's two levels and two best sets (4 x NB each).
    """
    nb = triton.next_power_of_2(budget)
    if levels:
        return torch.empty(4 * nb, dtype=torch.int64, device=device), torch.empty(4 * nb, dtype=torch.float64, device=device)
    return torch.empty(5 * nb, dtype=torch.int64, device=device), torch.empty(nb, dtype=torch.float64, device=device)
