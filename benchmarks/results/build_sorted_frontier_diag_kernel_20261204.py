"""Triton kernel: the serial build's pops over a frontier kept sorted (`method="sorted"`).

Prototype.
"""

from __future__ import annotations

import triton
import triton.language as tl

_KNONE32 = tl.constexpr(2**31 - 1)


@triton.jit
def _before(s1, k1, s2, k2):
    """Whether the frontier entry (s1, k1) pops before (s2, k2): the higher score, then the lower key."""
    return (s1 > s2) | ((s1 == s2) & (k1 < k2))


@triton.jit
def _propose(s, key, pscore, c, counter, active, vals_ptr, ws_ptr, ws_score_ptr, L, K: tl.constexpr, NB: tl.constexpr,
             SD: tl.constexpr, SR: tl.constexpr, SC: tl.constexpr, KNONE: tl.constexpr, VCM: tl.constexpr, VCONST: tl.constexpr):
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
    v_sib = tl.load(vals_ptr + d * K + r + 1, mask=has_sib, other=0.0, cache_modifier=VCM)
    if VCONST:
        v_sib = -0.25 - (r + 1).to(tl.float64) * 0.5
    sib_s = tl.where(has_sib, pscore + v_sib, float("-inf"))
    sib_k = tl.where(has_sib, (d.to(kt) << SD) | ((r + 1).to(kt) << SR) | (counter << SC) | q.to(kt), KNONE)
    counter += has_sib.to(kt)
    has_child = active & (d + 1 < L)
    v_child = tl.load(vals_ptr + (d + 1) * K, mask=has_child, other=0.0, cache_modifier=VCM)
    if VCONST:
        v_child = -0.25 - d.to(tl.float64) * 0.001
    child_s = tl.where(has_child, s + v_child, float("-inf"))
    child_k = tl.where(has_child, ((d + 1).to(kt) << SD) | (counter << SC) | (c + 1).to(kt), KNONE)
    counter += has_child.to(kt)
    return q, has_sib, v_sib, sib_s, sib_k, has_child, child_s, child_k, counter




@triton.jit
def _build_tree_sorted(
    vals_ptr, ids_ptr, root_ptr, L, spine, ws_ptr, ws_score_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr, score_ptr, n_ptr,
    BUDGET: tl.constexpr, K: tl.constexpr, B: tl.constexpr, NB: tl.constexpr, NP: tl.constexpr, COLS: tl.constexpr,
    SD: tl.constexpr, SR: tl.constexpr, SC: tl.constexpr, KNONE: tl.constexpr, NF: tl.constexpr,
    NOBAR: tl.constexpr, CM: tl.constexpr, VCM: tl.constexpr, VCONST: tl.constexpr, NOSTORE: tl.constexpr,
):
    KT = tl.int32 if KNONE == _KNONE32 else tl.int64
    i = tl.arange(0, NF)
    # The frontier but its best, m entries sorted in pop order, in buffer it % 2 of two (NF entries each): keys
    # (int64) after the layout's 5 x NB, scores and parent scores after the chosen scores' NB.
    fk_ptr = ws_ptr + 5 * NB
    fs_ptr = ws_score_ptr + NB
    fp_ptr = ws_score_ptr + NB + 2 * NF
    zero = tl.program_id(0) * 0
    # The frontier's best (the head) in registers: the root's first child, or nothing before a spine.
    v00 = tl.load(vals_ptr).to(tl.float64)
    h_s = tl.where(spine == 0, v00, float("-inf"))
    h_k = tl.where(spine == 0, zero.to(KT), KNONE)
    h_p = zero.to(tl.float64)
    m = zero
    counter = (zero + 1).to(KT)
    n_chosen = zero
    spine_score = zero.to(tl.float64)
    for it in range(BUDGET):
        cur = (it % 2) * NF
        nxt = NF - cur
        on_spine = it < spine
        # A spine step takes the previous spine node's child; any other step pops the head.
        s = tl.where(on_spine, spine_score + tl.load(vals_ptr + it * K, mask=on_spine, other=0.0), h_s)
        key = tl.where(on_spine, ((zero + it).to(KT) << SD) | (zero + it).to(KT), h_k)
        p = tl.where(on_spine, spine_score, h_p)
        act = on_spine | (h_k != KNONE)
        _, has_sib, _, x1_s, x1_k, has_child, x2_s, x2_k, counter = _propose(
            s, key, p, n_chosen, counter, act, vals_ptr, ws_ptr, ws_score_ptr, L, K, NB, SD, SR, SC, KNONE, VCM, VCONST)
        # A spine node's child is the next spine node, not a proposal, but for the last one's.
        x2_in = has_child & ~(on_spine & (it + 1 < spine))
        x2_s = tl.where(x2_in, x2_s, float("-inf"))
        x2_k = tl.where(x2_in, x2_k, KNONE)
        n_chosen += act.to(tl.int32)
        spine_score = tl.where(on_spine, s, spine_score)
        # Until the last spine step the whole frontier is in the buffer; from it on its best is taken out.
        out = (~on_spine | (it + 1 == spine)).to(tl.int32)
        # Entry i and entry i - 1 of the buffer (nothing past m; before everything at -1).
        live = i < m
        a_s = tl.load(fs_ptr + cur + i, mask=live, other=float("-inf"), cache_modifier=CM)
        a_k = tl.load(fk_ptr + cur + i, mask=live, other=KNONE, cache_modifier=CM).to(KT)
        a_p = tl.load(fp_ptr + cur + i, mask=live, other=0.0, cache_modifier=CM)
        prev_live = (i >= 1) & (i <= m)
        b_s = tl.where(i == 0, float("inf"), tl.load(fs_ptr + cur + i - 1, mask=prev_live, other=float("-inf"), cache_modifier=CM))
        b_k = tl.where(i == 0, 0, tl.load(fk_ptr + cur + i - 1, mask=prev_live, other=KNONE, cache_modifier=CM)).to(KT)
        r_s = tl.load(fs_ptr + cur, mask=m > 0, other=float("-inf"), cache_modifier=CM)
        r_k = tl.load(fk_ptr + cur, mask=m > 0, other=KNONE, cache_modifier=CM).to(KT)
        r_p = tl.load(fp_ptr + cur, mask=m > 0, other=0.0, cache_modifier=CM)
        # Places in the merge of the buffer and the two proposals: an entry moves up by the proposals before it;
        # a proposal sits at the gap between the entries around it (or after the last of a full buffer), up
        # by one if the other proposal is before it. The merge's first is the new head when `out`.
        x1_first = _before(x1_s, x1_k, x2_s, x2_k)
        x1_ahead = _before(x1_s, x1_k, a_s, a_k)
        x2_ahead = _before(x2_s, x2_k, a_s, a_k)
        pos = i + x1_ahead.to(tl.int32) + x2_ahead.to(tl.int32) - out
        keep = live & (pos >= 0) & (pos < NF)
        if NOSTORE:
            keep = keep & (i < 0)
        tl.store(fs_ptr + nxt + pos, a_s, mask=keep)
        tl.store(fk_ptr + nxt + pos, a_k.to(tl.int64), mask=keep)
        tl.store(fp_ptr + nxt + pos, a_p, mask=keep)
        at_end = (i == NF - 1) & (tl.zeros([NF], tl.int32) + m == NF)
        # (The flags as [NF] vectors: the interpreter gives int32 for a scalar bool & a vector bool.)
        gap1 = ((i * 0 + has_sib.to(tl.int32)) != 0) & ((_before(b_s, b_k, x1_s, x1_k) & x1_ahead) | (at_end & _before(a_s, a_k, x1_s, x1_k)))
        pos1 = tl.where(x1_ahead, i, NF) + (~x1_first).to(tl.int32) - out
        keep1 = gap1 & (pos1 >= 0) & (pos1 < NF)
        tl.store(fs_ptr + nxt + pos1, tl.zeros([NF], tl.float64) + x1_s, mask=keep1)
        tl.store(fk_ptr + nxt + pos1, tl.zeros([NF], tl.int64) + x1_k.to(tl.int64), mask=keep1)
        tl.store(fp_ptr + nxt + pos1, tl.zeros([NF], tl.float64) + p, mask=keep1)
        gap2 = ((i * 0 + x2_in.to(tl.int32)) != 0) & ((_before(b_s, b_k, x2_s, x2_k) & x2_ahead) | (at_end & _before(a_s, a_k, x2_s, x2_k)))
        pos2 = tl.where(x2_ahead, i, NF) + x1_first.to(tl.int32) - out
        keep2 = gap2 & (pos2 >= 0) & (pos2 < NF)
        tl.store(fs_ptr + nxt + pos2, tl.zeros([NF], tl.float64) + x2_s, mask=keep2)
        tl.store(fk_ptr + nxt + pos2, tl.zeros([NF], tl.int64) + x2_k.to(tl.int64), mask=keep2)
        tl.store(fp_ptr + nxt + pos2, tl.zeros([NF], tl.float64) + s, mask=keep2)
        # The new head, the best of the buffer's first and the proposals (when `out`).
        t1 = _before(x1_s, x1_k, r_s, r_k)
        n_s = tl.where(t1, x1_s, r_s)
        n_k = tl.where(t1, x1_k, r_k)
        n_p = tl.where(t1, p, r_p)
        t2 = _before(x2_s, x2_k, n_s, n_k)
        n_s = tl.where(t2, x2_s, n_s)
        n_k = tl.where(t2, x2_k, n_k)
        n_p = tl.where(t2, s, n_p)
        h_s = tl.where(out == 1, n_s, h_s)
        h_k = tl.where(out == 1, n_k, h_k)
        h_p = tl.where(out == 1, n_p, h_p)
        total = m + has_sib.to(tl.int32) + x2_in.to(tl.int32)
        m = tl.minimum(tl.maximum(total - out, 0), NF)
        if not NOBAR:
            tl.debug_barrier()
    tl.store(n_ptr, n_chosen.to(tl.int64))
