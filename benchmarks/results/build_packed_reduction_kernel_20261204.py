"""A variant of the heap build (tree_build/kernel.py at 8e18e25), not landed: its reduction with the two keys packed in one int64 (RED 1: 4 values) and the parent
score read from a mirrored workspace row (RED 2: 3 values), against RED 0 (today's 5 values)."""
import triton
import triton.language as tl
from ddtree_engine.kernels.tree_build.kernel import _KNONE32, _before, _propose, _place, _top2
from ddtree_engine.kernels.tree_build.layout import _KEY_BITS, _NONE, _count_below, _write_tree


@triton.jit
def _top2_packed(a1s, a1p, a2s, ak, b1s, b1p, b2s, bk):
    """_top2 with the best's and the runner-up's int32 keys in one int64 (best << 32 | runner-up)."""
    a1k = (ak >> 32).to(tl.int32)
    a2k = ak.to(tl.int32)
    b1k = (bk >> 32).to(tl.int32)
    b2k = bk.to(tl.int32)
    s1, k1, p1, s2, k2 = _top2(a1s, a1k, a1p, a2s, a2k, b1s, b1k, b1p, b2s, b2k)
    return s1, p1, s2, (k1.to(tl.int64) << 32) | k2.to(tl.int64)


@triton.jit
def _top2_packed_np(a1s, a2s, ak, b1s, b2s, bk):
    """_top2_packed without the parent score."""
    a1k = (ak >> 32).to(tl.int32)
    a2k = ak.to(tl.int32)
    b1k = (bk >> 32).to(tl.int32)
    b2k = bk.to(tl.int32)
    s1, k1, _, s2, k2 = _top2(a1s, a1k, a1s, a2s, a2k, b1s, b1k, b1s, b2s, b2k)
    return s1, s2, (k1.to(tl.int64) << 32) | k2.to(tl.int64)


@triton.jit
def _build_tree_v(
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
    RED: tl.constexpr,
):
    slot = tl.arange(0, NB)
    KT = tl.int32 if KNONE == _KNONE32 else tl.int64  # the frontier's keys (key_constants: int32 where they fit)
    # Slot 0: the root's first child (depth 0, rank 0, counter 0).
    v00 = tl.load(vals_ptr).to(tl.float64)
    f_score = tl.where(slot == 0, 0.0 + v00, float("-inf"))
    f_pscore = tl.zeros([NB], dtype=tl.float64)
    ps_ptr = ws_score_ptr + NB  # RED 2: the slots' parent scores, mirrored
    if RED == 2:
        tl.store(ps_ptr + slot, f_pscore)
        tl.debug_barrier()
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
        if RED == 2:
            tl.store(ps_ptr + n_chosen + 1, s, mask=has_child)
        spine_score = s
        n_chosen += 1
    for it in range(spine, BUDGET, 2):
        # The best two of the frontier, the best with its parent's score (its sibling's is parent + value).
        if RED == 0:
            s1, k1, p1, s2, k2 = tl.reduce((f_score, f_key, f_pscore, none_score, none_key), 0, _top2)
        elif RED == 1:
            s1, p1, s2, kk = tl.reduce((f_score, f_pscore, none_score, (f_key.to(tl.int64) << 32) | KNONE), 0, _top2_packed)
            k1 = (kk >> 32).to(KT)
            k2 = kk.to(tl.int32).to(KT)
        else:
            s1, s2, kk = tl.reduce((f_score, none_score, (f_key.to(tl.int64) << 32) | KNONE), 0, _top2_packed_np)
            k1 = (kk >> 32).to(KT)
            k2 = kk.to(tl.int32).to(KT)
            p1 = tl.load(ps_ptr + (k1 & ((1 << SC) - 1)), mask=k1 != KNONE, other=0.0)
        act1 = k1 != KNONE
        c1 = n_chosen
        q1, _, _, sib1_s, sib1_k, hc1, ch1_s, ch1_k, counter = _propose(
            s1, k1, p1, c1, counter, act1, vals_ptr, ws_ptr, ws_score_ptr, L, K, NB, SD, SR, SC, KNONE)
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
        if RED == 2:
            tl.store(ps_ptr + c1 + 1, s1, mask=hc1)
            tl.store(ps_ptr + c2 + 1, s2, mask=hc2)

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


