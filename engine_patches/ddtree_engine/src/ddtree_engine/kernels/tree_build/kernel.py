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

After the loop (`budget` pops, fixed), the chosen nodes are laid out depth-major: a
node's place is 1 + the number of chosen nodes with a smaller (depth, rank path) key, where the
rank path r1..rd packs into B bits per level (B = bits of K - 1), which is the reference's
order (by depth, then the parent's place, then rank).

`method="levels"` (`_build_tree_levels`, no spine) makes the same choice without the `budget` pops,
after reference.select_by_levels: each level keeps the top-`budget` children of the level kept before
it, ordered by (-score, rank, parent's place), and a running best-`budget` set G absorbs each level
(-score, then depth, then place: G's nodes are shallower and win ties). Both are merges of sorted
lists, so every rank is a count of binary searches: a child (p, r) lands at p plus, for each other
rank r', the r'-children of parents scoring so that they come first (sums compared as the
reference adds them, ties to the lower rank); a node of the level lands after G's nodes not below
it, a node of G after the level's nodes above it. L - 1 rounds of K - 1 searches (log2 budget + 1
steps each) replace `budget` serial reductions, and fewer: only the nodes that entered G have
children worth ranking (one G leaves out is beaten by `budget` shallower nodes, so are its
descendants), and once a level adds nothing to G the deeper ones are skipped. The layout is the
serial kernel's, on keys packed while the levels grow (depth, then the rank path with the root side
most significant). Equal to the reference on every tree shape and at the real budgets
(tests/ddtree_engine/kernels/test_tree_build.py and, on the H200, -k "real or more_warps").

Measured on the H200 (benchmarks/bench_tree_step.py, 2026-12-03 08:31 run, build alone in a CUDA graph,
serial with two pops a reduction and int32 keys): on random logits, whose trees are shallow (budget 256: 3
deep), levels at 8 warps is 1.04x the serial build at budget 256 (97.3 against 101.3 us) and slower at 64
(23.2 against 21.1); on peaked logits (one token per depth far ahead, the shape a confident drafter gives: 15
deep) it is 4-5x slower at every budget (budget 256: 409.2 against 106.0 us), since each level is a round of
searches whatever it adds. A drafter's trees are deep, so "serial" stays the default.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Globals a kernel reads must be tl.constexpr (Triton refuses plain globals when compiling).
_NONE = tl.constexpr(9223372036854775807)  # a layout key after every chosen node's (padding rows)
_KEY_BITS = tl.constexpr(56)  # rank-path bits below the depth in the layout key


@triton.jit
def _top2(a1s, a1k, a1p, a2s, a2k, b1s, b1k, b1p, b2s, b2k):
    """Combine two (best, runner-up) pairs, each ordered, into the best two: (score, key, parent score) of the
    best, (score, key) of the runner-up (a second pop's sibling is scored in the frontier, not as a scalar)."""
    a_first = (a1s > b1s) | ((a1s == b1s) & (a1k < b1k))
    # The runner-up: a's second against b's first, or a's first against b's second.
    xs = tl.where(a_first, a2s, a1s)
    xk = tl.where(a_first, a2k, a1k)
    ys = tl.where(a_first, b1s, b2s)
    yk = tl.where(a_first, b1k, b2k)
    x_first = (xs > ys) | ((xs == ys) & (xk < yk))
    return (tl.where(a_first, a1s, b1s), tl.where(a_first, a1k, b1k), tl.where(a_first, a1p, b1p),
            tl.where(x_first, xs, ys), tl.where(x_first, xk, yk))


@triton.jit
def _propose(s, key, pscore, c, counter, active, vals_ptr, ws_ptr, ws_score_ptr, L, K: tl.constexpr, NB: tl.constexpr,
             SD: tl.constexpr, SR: tl.constexpr, SC: tl.constexpr, KNONE: tl.constexpr):
    """Choose the node (s, key) whose parent scores `pscore` as selection c (if active): record it, and make
    its two proposals as scalars, its next sibling (same slot q; also its value, for a score taken in the
    frontier) and its first child (slot c + 1). The key is depth << SD | rank << SR | counter << SC | slot."""
    kt = key.dtype
    d = (key >> SD).to(tl.int32)
    r = ((key >> SR) & ((1 << (SD - SR)) - 1)).to(tl.int32)
    q = (key & ((1 << SC) - 1)).to(tl.int32)
    tl.store(ws_ptr + c, q - 1, mask=active)
    tl.store(ws_ptr + NB + c, d, mask=active)
    tl.store(ws_ptr + 2 * NB + c, r, mask=active)
    tl.store(ws_score_ptr + c, s, mask=active)
    has_sib = active & (r + 1 < K)
    v_sib = tl.load(vals_ptr + d * K + r + 1, mask=has_sib, other=0.0)
    sib_s = tl.where(has_sib, pscore + v_sib, float("-inf"))
    sib_k = tl.where(has_sib, (d.to(kt) << SD) | ((r + 1).to(kt) << SR) | (counter << SC) | q.to(kt), KNONE)
    counter += has_sib.to(kt)
    has_child = active & (d + 1 < L)
    v_child = tl.load(vals_ptr + (d + 1) * K, mask=has_child, other=0.0)
    child_s = tl.where(has_child, s + v_child, float("-inf"))
    child_k = tl.where(has_child, ((d + 1).to(kt) << SD) | (counter << SC) | (c + 1).to(kt), KNONE)
    counter += has_child.to(kt)
    return q, has_sib, v_sib, sib_s, sib_k, has_child, child_s, child_k, counter


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
def _write_tree(
    place, par_place, dep, rnk, score, cm, n_chosen, root_ptr, ids_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr, score_ptr,
    n_ptr, BUDGET: tl.constexpr, K: tl.constexpr, NP: tl.constexpr,
):
    """Both builds' output: each chosen node (cm) at its place, the root at 0, padding after the last."""
    root = tl.load(root_ptr)
    tl.store(tok_ptr + place, tl.load(ids_ptr + dep * K + rnk, mask=cm, other=0), mask=cm)
    tl.store(par_ptr + place, par_place, mask=cm)
    tl.store(dep_ptr + place, dep.to(tl.int64) + 1, mask=cm)
    tl.store(rank_ptr + place, rnk.to(tl.int64), mask=cm)
    tl.store(score_ptr + place, score, mask=cm)
    ni = tl.arange(0, NP)
    rest = (ni < BUDGET + 1) & ((ni == 0) | (ni > n_chosen))
    tl.store(tok_ptr + ni, tl.zeros([NP], dtype=tl.int64) + root, mask=rest)
    tl.store(par_ptr + ni, tl.full([NP], -1, tl.int64), mask=rest)
    tl.store(dep_ptr + ni, tl.zeros([NP], dtype=tl.int64), mask=rest)
    tl.store(rank_ptr + ni, tl.full([NP], -1, tl.int64), mask=rest)
    tl.store(score_ptr + ni, tl.where(ni == 0, 0.0, float("-inf")).to(tl.float64), mask=rest)
    tl.store(n_ptr, (n_chosen + 1).to(tl.int64))


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
    KEY32: tl.constexpr,
    SD: tl.constexpr,
    SR: tl.constexpr,
    SC: tl.constexpr,
    KNONE: tl.constexpr,
):
    slot = tl.arange(0, NB)
    KT = tl.int32 if KEY32 else tl.int64  # the frontier's keys (key_constants: int32 where the fields fit)
    # Slot 0: the root's first child (depth 0, rank 0, counter 0).
    v00 = tl.load(vals_ptr).to(tl.float64)
    f_score = tl.where(slot == 0, 0.0 + v00, float("-inf"))
    f_pscore = tl.zeros([NB], dtype=tl.float64)
    f_key = tl.where(slot == 0, 0, KNONE).to(KT)
    none_score = tl.full([NB], float("-inf"), tl.float64)
    none_key = tl.full([NB], KNONE, KT)
    # Loop-carried scalars start as tensors (a constexpr start would change type in the loop).
    zero = tl.program_id(0) * 0
    counter = (zero + 1).to(KT)
    n_chosen = zero
    spine_score = zero.to(tl.float64)
    for it in range(spine):
        # A spine step takes slot `it` (the previous spine node's child) whatever the heap says.
        s = spine_score + tl.load(vals_ptr + it * K)
        key = ((zero + it).to(KT) << SD) | (zero + it).to(KT)
        q, _, _, sib_s, sib_k, has_child, child_s, child_k, counter = _propose(
            s, key, spine_score, n_chosen, counter, zero == 0, vals_ptr, ws_ptr, ws_score_ptr, L, K, NB, SD, SR, SC, KNONE)
        f_score, f_pscore, f_key = _place(f_score, f_pscore, f_key, slot, zero == 0, q, sib_s, sib_k, has_child,
                                          n_chosen, child_s, child_k, s)
        spine_score = s
        n_chosen += 1
    for it in range(spine, BUDGET, 2):
        # The best two of the frontier, the best with its parent's score (its sibling's is parent + value).
        s1, k1, p1, s2, k2 = tl.reduce((f_score, f_key, f_pscore, none_score, none_key), 0, _top2)
        act1 = k1 != KNONE
        c1 = n_chosen
        q1, _, _, sib1_s, sib1_k, hc1, ch1_s, ch1_k, counter = _propose(
            s1, k1, p1, c1, counter, act1, vals_ptr, ws_ptr, ws_score_ptr, L, K, NB, SD, SR, SC, KNONE)
        n_chosen += act1.to(tl.int32)
        # The second pop: the runner-up, or one of the first pop's proposals if it beats it.
        take = (sib1_s > s2) | ((sib1_s == s2) & (sib1_k < k2))
        s2 = tl.where(take, sib1_s, s2)
        k2 = tl.where(take, sib1_k, k2)
        take = (ch1_s > s2) | ((ch1_s == s2) & (ch1_k < k2))
        s2 = tl.where(take, ch1_s, s2)
        k2 = tl.where(take, ch1_k, k2)
        act2 = (it + 1 < BUDGET) & (k2 != KNONE)
        c2 = n_chosen
        q2, hs2, v_sib2, _, sib2_k, hc2, ch2_s, ch2_k, counter = _propose(
            s2, k2, s2, c2, counter, act2, vals_ptr, ws_ptr, ws_score_ptr, L, K, NB, SD, SR, SC, KNONE)
        n_chosen += act2.to(tl.int32)
        # In pop order: the second pop may have taken a slot the first just wrote, so its sibling is scored
        # on the frontier's parent scores after the first pop's writes.
        f_score, f_pscore, f_key = _place(f_score, f_pscore, f_key, slot, act1, q1, sib1_s, sib1_k, hc1, c1, ch1_s,
                                          ch1_k, s1)
        sib2_s = tl.where(hs2, f_pscore + v_sib2, float("-inf"))
        f_score, f_pscore, f_key = _place(f_score, f_pscore, f_key, slot, act2, q2, sib2_s, sib2_k, hc2, c2, ch2_s,
                                          ch2_k, s2)

    tl.debug_barrier()
    # Layout: depth-major, then the rank path; new place = 1 + #(smaller keys).
    ci = tl.arange(0, NB)
    cm = ci < n_chosen
    par = tl.load(ws_ptr + ci, mask=cm, other=-1)
    dep = tl.load(ws_ptr + NB + ci, mask=cm, other=0)
    rnk = tl.load(ws_ptr + 2 * NB + ci, mask=cm, other=0)
    code = rnk.to(tl.int64)
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
    tl.store(ws_ptr + 4 * NB + ci, place, mask=cm)
    tl.debug_barrier()
    par_place = tl.load(ws_ptr + 4 * NB + par, mask=cm & (par >= 0), other=0)
    score = tl.load(ws_score_ptr + ci, mask=cm, other=0.0)
    _write_tree(place, par_place, dep, rnk, score, cm, n_chosen, root_ptr, ids_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr,
                score_ptr, n_ptr, BUDGET, K, NP)


@triton.jit
def _count_below(keys_ptr, n, rows_key, NB: tl.constexpr, COLS: tl.constexpr):
    """Per row of rows_key [NB, 1]: how many of the first n keys at keys_ptr are smaller (int32), COLS
    keys at a time, each tile loaded as a row ([1, COLS]) against the column. Measured on the H200 (2026-12-03,
    build alone in a CUDA graph, the loop's pops skipped): budget 256 5.3 us against 21.9 with the 1-D keys
    expanded to both axes, budget 64 5.1 against 8.3."""
    count = tl.zeros([NB], dtype=tl.int32)
    for j0 in range(0, NB, COLS):
        cj = j0 + tl.arange(0, COLS)
        kj = tl.load(keys_ptr + cj[None, :], mask=cj[None, :] < n, other=_NONE)
        count += tl.sum((kj < rows_key).to(tl.int32), axis=1)
    return count


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
):
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
    g_fin = g_off
    cm = pi < n_g
    key = tl.load(ws_ptr + g_fin + pi, mask=cm, other=_NONE)
    score = tl.load(ws_score_ptr + g_fin + pi, mask=cm, other=0.0)
    dep = (key >> _KEY_BITS).to(tl.int32)
    shift = (top - B * dep).to(tl.int64)
    rnk = ((key >> shift) & ((1 << B) - 1)).to(tl.int32)
    # Both counts on the keys read back as a column (_count_below); the parent's key is the node's with
    # its own rank cleared, one level up.
    keyr = tl.load(ws_ptr + g_fin + pi[:, None], mask=cm[:, None], other=_NONE)
    depr = keyr >> _KEY_BITS
    shiftr = top - B * depr
    one = tl.full([NB, 1], 1, tl.int64)
    pkeyr = ((depr - 1) << _KEY_BITS) | ((keyr & ((one << _KEY_BITS) - 1)) & ~(((one << B) - 1) << shiftr))
    place = _count_below(ws_ptr + g_fin, n_g, keyr, NB, COLS).to(tl.int64) + 1
    pplace = _count_below(ws_ptr + g_fin, n_g, pkeyr, NB, COLS).to(tl.int64)
    pplace = tl.where(dep > 0, pplace + 1, 0)
    _write_tree(place, pplace, dep, rnk, score, cm, n_g, root_ptr, ids_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr,
                score_ptr, n_ptr, BUDGET, K, NP)


def rank_bits(k: int) -> int:
    """Bits per tree level of the layout key: enough for ranks 0 .. k - 1 (at least 1)."""
    return max(1, (k - 1).bit_length())


def supports(depths: int, k: int, budget: int) -> bool:
    """Whether the kernel takes this shape: the layout key must fit (B * L <= 56 bits), and
    the frontier's slot and counter fields their 12 and 20 bits."""
    return rank_bits(k) * depths <= _KEY_BITS.value and budget < 4096 and k < 4096


# Budgets from which the build kernel takes 4 warps. Measured on the H200 in a CUDA graph
# (benchmarks/bench_tree_step.py, 2026-12-03 08:31, two pops a reduction, int32 keys): budget 64 21.0 us at
# 1 warp, 27.5 at 2, 26.3 at 4; budget 256 118.3 us at 1 warp, 124.0 at 2, 101.2 at 4, 117.9 at 8 (2026-12-01,
# one pop a reduction: 64 28.4 at 1, 30.8 at 4; 256 269.5 at 1, 131.2 at 4). The heap lives in a global
# workspace the warps share: 2, 4 and 8 warps gave the reference's trees on every tree shape, random shapes
# up to budget 300 and the real budgets on the H200 (tests/ddtree_engine/kernels/test_tree_build.py -k
# more_warps, 2026-12-01, and with this loop 2026-12-03).
MANY_WARPS_FROM_BUDGET = 128


def default_warps(budget: int) -> int:
    """Warps of the build kernel's one program at `budget`: 1 up to budget 127, 4 from 128."""
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The draft tree over the per-depth top-K, fixed shape N = budget + 1 (Triton).

    Args:
        vals: [L, K] float64 per-depth log-probs, best first; ids: [L, K] int64 token ids.
        budget: drafted nodes, >= 1.
        root: [1] int64 on vals' device, the root token (read by the kernel: no host sync).
        spine_depth: reserve the top-1 chain down to this depth first (capped by L, budget).
        out: optional (tokens, parents, depths, ranks, scores, num_nodes) buffers to fill.
        num_warps: warps of the single program; None takes `default_warps(budget)`.
        method: "serial", the heap replayed pop by pop (`budget` steps), or "levels", the same choice
            level by level (`_build_tree_levels`: L - 1 merges of ranked candidates, no spine; with
            spine_depth > 0 it builds "serial"). Faster on shallow trees only (module docstring), so not the default.

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
        raise ValueError(f"expected ceil(log2 K) * L <= {_KEY_BITS.value}, budget and K < 4096, got L {depths}, K {k}")
    if root.numel() != 1 or root.device != vals.device:
        raise ValueError(f"expected a one-element root tensor on {vals.device}, got {tuple(root.shape)} on {root.device}")
    if method not in ("serial", "levels"):
        raise ValueError(f"expected method 'serial' or 'levels', got {method!r}")
    device = vals.device
    n_out = budget + 1
    if out is None:
        out = (
            *(torch.empty(n_out, dtype=torch.int64, device=device) for _ in range(4)),
            torch.empty(n_out, dtype=torch.float64, device=device),
            torch.empty(1, dtype=torch.int64, device=device),
        )
    spine = min(spine_depth, depths, budget)
    levels = method == "levels" and spine == 0
    inputs = (vals.contiguous(), ids.contiguous(), root.to(torch.int64), depths)
    shape = dict(launch_constants(budget, k, levels), num_warps=num_warps or default_warps(budget))
    ws, ws_score = workspaces(budget, levels, device)
    if levels:
        _build_tree_levels[(1,)](*inputs, ws, ws_score, *out, **shape)
    else:
        _build_tree[(1,)](*inputs, spine, ws, ws_score, *out, **shape)
    return out


def launch_constants(budget: int, k: int, levels: bool) -> dict:
    """The build kernels' constexprs at (budget, K): `_build_tree`'s (with `key_constants`), or with `levels`
    `_build_tree_levels`' (KP, LOGB added, no key layout). tree_step's one-launch kernel takes both."""
    nb = triton.next_power_of_2(budget)
    consts = dict(BUDGET=budget, K=k, B=rank_bits(k), NB=nb, NP=triton.next_power_of_2(budget + 1), COLS=min(nb, 16))
    if levels:
        consts.update(KP=triton.next_power_of_2(k), LOGB=nb.bit_length())
    else:
        consts.update(key_constants(budget, k))
    return consts


def key_constants(budget: int, k: int) -> dict:
    """The serial build's frontier key, depth << SD | rank << SR | counter << SC | slot: int32 (KEY32) where
    slots up to next_power_of_2(budget), counters up to 2 * budget + 1, ranks up to K - 1 and depths up to
    63 fit in 31 bits (budget 256, K 8: 9 + 10 + 3 + 6), else int64 (12, 20, 12 bits and the depth above).
    The int32 key: H200 2026-12-03, build alone in a CUDA graph, with the runner-up's parent score left out
    of the reduction: budget 256 100.8 us against 108.3, 64 21.5 against 23.6, 15 9.7 against 9.9."""
    nb = triton.next_power_of_2(budget)
    sc = nb.bit_length()
    sr = sc + (2 * budget + 2).bit_length()
    sd = sr + rank_bits(k)
    if sd + 6 <= 31:
        return dict(KEY32=True, SD=sd, SR=sr, SC=sc, KNONE=2**31 - 1)
    return dict(INT64_KEYS)


# The int64 frontier key (supports(): budget and K below 4096): slot 12 bits, counter 20, rank 12, depth above.
INT64_KEYS = dict(KEY32=False, SD=44, SR=32, SC=12, KNONE=2**63 - 1)


def workspaces(budget: int, levels: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The build's global workspace (int64, float64): the serial heap's chosen nodes, layout keys and
    places (5 x NB) and scores (NB), or the levels build's two levels and two best sets (4 x NB each)."""
    nb = triton.next_power_of_2(budget)
    if levels:
        return torch.empty(4 * nb, dtype=torch.int64, device=device), torch.empty(4 * nb, dtype=torch.float64, device=device)
    return torch.empty(5 * nb, dtype=torch.int64, device=device), torch.empty(nb, dtype=torch.float64, device=device)
