"""Triton kernel: the serial build's tree (kernel.py), selected by a threshold (`method="threshold"`; TreeStep's
default from budget 128, tree_step.THRESHOLD_FROM_BUDGET).

The heap pops its whole order (-score, depth, rank, the parent's order; reference.select_by_levels), and scores in
non-increasing order (log-probs are <= 0, so a proposal never beats its proposer), so its choice is the BUDGET
best-scoring prefixes, an exact tie at the budget's boundary cut by that order. Any BUDGET distinct prefixes give a
lower bound t on the BUDGET-th best score t*, and every prefix scoring >= t* has ancestors scoring no less, so a
level-by-level enumeration of the prefixes scoring >= t holds the whole choice: each level is the kept level's
children filtered by t and compacted by a cumulative sum, no ranking.

- Start bound: the BUDGET-th best of distinct prefixes scored at once: the whole tree down to depth FD (K**FD <=
  512: bushy trees' choice lies there), and deeper the spine with at most one deviation (rank r >= 1 at one depth
  j <= d: peaked trees'), by a radix select cut short after BOUND_ROUNDS rounds (its lowest key still in the
  running: still a bound), less a margin for sums added in another order.
- The pool (every prefix enumerated so far scoring >= t) has room for CAP; when it passes CAP, or a level
  passes NPAR parents, t rises to a bound of the pool's BUDGET-th best (`_kth`: a radix select, 4-bit digits,
  one `tl.histogram` a round, each at the highest bit where the keys still in the running differ) and the pool
  is compacted.
- The cut: the pool's BUDGET-th best t_fin, exactly. Every entry above it is chosen; when the budget splits the
  entries tied at t_fin, `_tied_order` takes the first in the heap's order (up to TIED_CAP of them). The serial
  build (`_build_tree`) runs in the same launch instead for larger ties, for a tightening that leaves a level or
  the pool too large (massive ties: integer logits), and for rows with a positive value; `fell_back` says so.
  Shapes whose vectors pass MAX_VECTOR (`fitting_constants`: budget 1,024 at K 8, K 256) build serially (kernel.py).

The pool keeps its entries in the layout's order (layout keys, depth above `_KEY_BITS`, the rank path below,
ascending): each level is appended in its parents' order, then rank, and compactions and the cut keep order. So a
chosen node's place is 1 + its index, and its parent's is found by a binary search (layout `_write_sorted_tree`).

H200, 2026-12-04 ~21:05 UTC (benchmarks/results/build_threshold_cut2_20261204.{py,txt,json}, bf16 [15, 151,936]
logits, 7 draws): whole step in a CUDA graph at budget 256 51.1-58.8 us against the serial build's 121.8-125.3,
128 40.4-56.4 against 72.8-77.6, the serial step's arrays on every draw with no fallback (ties split at the cut
on 11 of 21); the build alone 22.6-28.1 us at 256. By stage (clock64 stamps, build_threshold_prof_20261204.*, 256):
candidates ~2.8 us, start bound's select ~6.2, levels 4.7-5.5 (peaked 8.8), cut 6.6-8.4 (with a split tie's
order), layout ~0.9. The same day's first version took 89.8-95.1 us at 256 (build_threshold_cut_20261204.*): its
layout counted the keys below each node and its parent (12-13 us), its selects took 16 fixed rounds from the top
bit (4-10 us), the tie order expanded vectors to both axes of its [TC, TC] tile (~26 us a split tie), and every
level took the 256-parent tile (20 us on peaked trees' 15 levels, 8.9 with NARROW_LEVEL 32).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..gdc import gdc_enter
from .kernel import _build_tree
from .layout import _KEY_BITS, _write_sorted_tree

_MIN = tl.constexpr(-9223372036854775807 - 1)
_MAX = tl.constexpr(9223372036854775807)
# Prefixes tied at the cut that the kernel orders itself (`_tied_order`, [TIED_CAP, TIED_CAP] comparisons); more
# than this, split by the budget, go to the serial build.
TIED_CAP = 32
# The parents' tile of a narrow level (`_level`): levels of at most this many parents take it, wider ones NPAR's.
NARROW_LEVEL = 32
# Rounds of the bounds' radix selects (the start bound, a tightening); the cut's takes all it needs (16 at most).
BOUND_ROUNDS = 3


@triton.jit
def _key(s):
    """int64 image of fp64 scores, in their order (-0.0 as +0.0)."""
    s = tl.where(s == 0.0, 0.0, s)
    b = s.to(tl.int64, bitcast=True)
    return b ^ ((b >> 63) & 0x7FFFFFFFFFFFFFFF)


@triton.jit
def _unkey(k):
    b = k ^ ((k >> 63) & 0x7FFFFFFFFFFFFFFF)
    return b.to(tl.float64, bitcast=True)


@triton.jit
def _msb(d):
    """The highest set bit of the int64 d != 0 (63 where d < 0): six halvings, scalars only."""
    neg = d < 0
    d = tl.where(neg, 1, d)
    m = d * 0
    for h in tl.static_range(6):
        w = 32 >> h
        up = (d >> w) != 0
        m = tl.where(up, m + w, m)
        d = tl.where(up, d >> w, d)
    return tl.where(neg, 63, m).to(tl.int32)


@triton.jit
def _kth(x, KSEL, N: tl.constexpr, ROUNDS: tl.constexpr = 16):
    """The KSEL-th largest of the int64 keys x [N] (_MIN pads count as keys, below every real one): a radix
    select, 4-bit digits, one histogram a round, each round's digit at the highest bit where the keys still in
    the running differ (their lowest and highest), so the bits they share cost nothing, and it stops when they
    are all equal (16 rounds at most: each round's digit lies at least 4 bits below the last's). With ROUNDS < 16,
    the lowest key still in the running after ROUNDS rounds: a lower bound of the KSEL-th (which is among them)."""
    u = (x ^ _MIN).to(tl.uint64, bitcast=True)
    bins = tl.arange(0, 32)
    # The pads leave the running at once when the real keys number KSEL or more (else the KSEL-th is a pad).
    alive = x != _MIN
    alive = alive | (tl.sum(alive.to(tl.int32), 0) < KSEL)
    rem = KSEL
    lo = tl.min(tl.where(alive, x, _MAX), 0)
    hi = tl.max(tl.where(alive, x, _MIN), 0)
    for r in tl.static_range(ROUNDS):
        if lo != hi:
            shift = tl.maximum(_msb(lo ^ hi) - 3, 0)
            digit = ((u >> shift.to(tl.uint64)) & 15).to(tl.int32)
            digit = tl.where(alive, digit, 16)  # keys out of the running go to a bin nobody reads
            hist = tl.histogram(digit, 32)
            counts = tl.where(bins < 16, hist, 0)
            above = tl.sum(counts, 0) - tl.cumsum(counts, 0)  # keys in higher digits
            hit = (bins < 16) & (above < rem) & (above + counts >= rem)
            dsel = tl.max(tl.where(hit, bins, -1), 0)
            rem = rem - tl.sum(tl.where(bins == dsel, above, 0), 0)
            alive = alive & (digit == dsel)
            lo = tl.min(tl.where(alive, x, _MAX), 0)
            hi = tl.max(tl.where(alive, x, _MIN), 0)
    return lo


@triton.jit
def _pool_keys(ps_ptr, n, N: tl.constexpr):
    """The score keys of the n (<= N) pool scores at ps_ptr, _MIN after them ([N])."""
    i = tl.arange(0, N)
    return tl.where(i < n, _key(tl.load(ps_ptr + i, mask=i < n, other=0.0)), _MIN)


@triton.jit
def _pool_kth(ps_ptr, n, KSEL, SMALL: tl.constexpr, CAPT: tl.constexpr, ROUNDS: tl.constexpr = 16):
    """The KSEL-th best score key of the n pool scores at ps_ptr (n >= KSEL), over SMALL keys when they fit
    (a lower bound of it with ROUNDS < 16, `_kth`)."""
    if n <= SMALL:
        kth = _kth(_pool_keys(ps_ptr, n, SMALL), KSEL, SMALL, ROUNDS)
    else:
        kth = _kth(_pool_keys(ps_ptr, n, CAPT), KSEL, CAPT, ROUNDS)
    return kth


@triton.jit
def _bound(kth):
    """A score at most the key kth's (`_kth`, cut short or not), less a margin for sums added in another order;
    -inf where the key is a pad's (_MIN, a NaN's bits)."""
    t0 = _unkey(kth)
    t0 = t0 - tl.abs(t0) * 1e-9 - 1e-300
    return tl.where(t0 == t0, t0, float("-inf"))


@triton.jit
def _compact(ps_ptr, pc_ptr, qs_ptr, qc_ptr, n, t, d, CAPT: tl.constexpr):
    """The pool's entries scoring >= t, in order, to the other buffer; returns (kept, kept at depth d)."""
    i = tl.arange(0, CAPT)
    s = tl.load(ps_ptr + i, mask=i < n, other=float("-inf"))
    c = tl.load(pc_ptr + i, mask=i < n, other=0)
    keep = ((i < n) & (s >= t)).to(tl.int32)
    pos = tl.cumsum(keep, 0) - keep
    tl.store(qs_ptr + pos, s, mask=keep > 0)
    tl.store(qc_ptr + pos, c, mask=keep > 0)
    at_d = tl.sum(tl.where((keep > 0) & ((c >> _KEY_BITS) == d), 1, 0), 0)
    return tl.sum(keep, 0), at_d


@triton.jit
def _tied_order(vals_ptr, codes_ptr, n_tie, need, top, sc_ptr, rc_ptr, K: tl.constexpr, B: tl.constexpr,
                TC: tl.constexpr):
    """Which of the n_tie prefixes tied at one score (layout codes at codes_ptr, up to TC) are among the first
    `need` in the heap's order (reference.select_by_levels): shallower first; at one depth, lower rank, then the
    parents' order (higher score, lower rank, then theirs), so the deepest level where two rank paths differ in
    score or rank decides. Each prefix's scores are summed root first, as the pool's (and the reference's) are,
    level by level into the scratch rows sc_ptr (scores) and rc_ptr (ranks); the
    pairwise comparisons then load each level's row twice, as a column and as a row of the [TC, TC] tile, which
    costs no layout conversion (expanding one vector to both axes goes through shared memory, as
    layout._count_below found)."""
    ti = tl.arange(0, TC)
    valid = ti < n_tie
    code = tl.load(codes_ptr + ti, mask=valid, other=0)
    dep = (code >> _KEY_BITS).to(tl.int32)
    deepest = tl.max(tl.where(valid, dep, 0), 0)
    s = tl.zeros([TC], dtype=tl.float64)
    for j in range(0, deepest + 1):
        live = valid & (j <= dep)
        r = ((code >> tl.maximum(top - B * j, 0).to(tl.int64)) & ((1 << B) - 1)).to(tl.int32)
        s = tl.where(live, s + tl.load(vals_ptr + j * K + r, mask=live, other=0.0).to(tl.float64), s)
        tl.store(sc_ptr + j * TC + ti, s)
        tl.store(rc_ptr + j * TC + ti, r.to(tl.int64))  # 0 below the prefix's depth, its code's bits there
    tl.debug_barrier()
    xi = ti[:, None]
    yi = ti[None, :]
    first = tl.zeros([TC, TC], dtype=tl.int1)  # x before y, by the deepest level where they differ
    for j in range(0, deepest + 1):
        sx = tl.load(sc_ptr + j * TC + xi)
        sy = tl.load(sc_ptr + j * TC + yi)
        rx = tl.load(rc_ptr + j * TC + xi)
        ry = tl.load(rc_ptr + j * TC + yi)
        differ = (sx != sy) | (rx != ry)  # below one's depth: only against a deeper prefix, which the depth decides
        first = tl.where(differ, (sx > sy) | ((sx == sy) & (rx < ry)), first)
    dx = tl.load(codes_ptr + xi, mask=xi < n_tie, other=0) >> _KEY_BITS
    dy = tl.load(codes_ptr + yi, mask=yi < n_tie, other=0) >> _KEY_BITS
    before = (xi < n_tie) & (yi < n_tie) & ((dx < dy) | ((dx == dy) & first))
    ahead = tl.sum(before.to(tl.int32), 0)  # per y: the tied prefixes before it
    return valid & (ahead < need)


@triton.jit
def _cut(vals_ptr, tws_ptr, tws_score_ptr, base, free, chosen, n_pool, n_g, t, bad, top, BUDGET: tl.constexpr,
         K: tl.constexpr, B: tl.constexpr, NB: tl.constexpr, TC: tl.constexpr, N: tl.constexpr):
    """The chosen n_g of the n_pool (<= N) pool entries at base, in pool order (the layout's: ascending keys) to
    `chosen`: those scoring above the pool's BUDGET-th best t_fin, and of those tied at t_fin, all, or when the
    budget splits them (up to TC), the first in the heap's order (`_tied_order`, its scratch in the free pool
    buffer). Returns `bad`, set where the serial build must run instead (a larger split tie)."""
    tied_at = chosen + NB
    cut = (n_pool > BUDGET).to(tl.int32)
    t_fin = t
    if cut > 0:
        t_fin = _unkey(_kth(_pool_keys(tws_score_ptr + base, n_pool, N), BUDGET, N))
    i = tl.arange(0, N)
    inpool = i < n_pool
    s = tl.load(tws_score_ptr + base + i, mask=inpool, other=float("-inf"))
    c = tl.load(tws_ptr + base + i, mask=inpool, other=0)
    ti = (inpool & (s == t_fin)).to(tl.int32) * cut
    tie = ti > 0
    ai = (inpool & (s >= t_fin)).to(tl.int32) - ti
    n_above = tl.sum(ai, 0)
    n_tie = tl.sum(ti, 0)
    need = n_g - n_above
    split = (need < n_tie).to(tl.int32)
    bad = bad | ((need < 0) | (need > n_tie) | ((split > 0) & (n_tie > TC))).to(tl.int32)
    keep = ai + ti * (1 - split)
    if (split > 0) & (bad == 0):
        tpos = tl.cumsum(ti, 0) - ti
        tl.store(tws_ptr + tied_at + tpos, c, mask=tie)
        tl.debug_barrier()
        sel = _tied_order(vals_ptr, tws_ptr + tied_at, n_tie, need, top, tws_score_ptr + free, tws_ptr + free, K, B, TC)
        tl.debug_barrier()
        tj = tl.arange(0, TC)
        tl.store(tws_ptr + tied_at + tj, sel.to(tl.int64), mask=tj < n_tie)
        tl.debug_barrier()
        keep = ai + (tl.load(tws_ptr + tied_at + tpos, mask=tie, other=0) != 0).to(tl.int32)
    pos = tl.cumsum(keep, 0) - keep
    tl.store(tws_score_ptr + chosen + pos, s, mask=(keep > 0) & (pos < NB))
    tl.store(tws_ptr + chosen + pos, c, mask=(keep > 0) & (pos < NB))
    return bad


@triton.jit
def _level(vals_ptr, pc_ptr, ps_ptr, lvl, n_lvl, n_pool, d, t, top, K: tl.constexpr, KP: tl.constexpr, B: tl.constexpr,
           NPT: tl.constexpr):
    """One level of the enumeration: the children of the pool's last level (n_lvl <= NPT entries from lvl) scoring
    >= t, appended to the pool (codes pc_ptr, scores ps_ptr) after its n_pool entries, in their parents' order, then
    rank (the layout's order); returns how many. NPT: the parents' tile (a small one for narrow levels)."""
    pi = tl.arange(0, NPT)
    ri = tl.arange(0, KP)
    s_par = tl.load(ps_ptr + lvl + pi, mask=pi < n_lvl, other=float("-inf"))
    c_par = tl.load(pc_ptr + lvl + pi, mask=pi < n_lvl, other=0)
    vd = tl.load(vals_ptr + d * K + ri, mask=ri < K, other=float("-inf")).to(tl.float64)
    ch = s_par[:, None] + vd[None, :]  # as the reference adds them
    okc = (pi < n_lvl)[:, None] & (ri < K)[None, :] & (ch >= t)
    path = (c_par & ((tl.zeros([NPT], dtype=tl.int64) + 1 << _KEY_BITS) - 1))[:, None]
    code = path | (ri.to(tl.int64)[None, :] << (top - B * d)) | ((tl.zeros([KP], dtype=tl.int64) + d)[None, :] << _KEY_BITS)
    okf = tl.reshape(okc.to(tl.int32), [NPT * KP])
    posf = tl.cumsum(okf, 0) - okf
    tl.store(ps_ptr + n_pool + posf, tl.reshape(ch, [NPT * KP]), mask=okf > 0)
    tl.store(pc_ptr + n_pool + posf, tl.reshape(code, [NPT * KP]), mask=okf > 0)
    return tl.sum(okf, 0)


@triton.jit
def _build_tree_threshold(
    vals_ptr, ids_ptr, root_ptr, L, spine, ws_ptr, ws_score_ptr, tws_ptr, tws_score_ptr,
    tok_ptr, par_ptr, dep_ptr, rank_ptr, score_ptr, n_ptr, flag_ptr,
    BUDGET: tl.constexpr, K: tl.constexpr, B: tl.constexpr, NB: tl.constexpr, NP: tl.constexpr, COLS: tl.constexpr,
    SD: tl.constexpr, SR: tl.constexpr, SC: tl.constexpr, KNONE: tl.constexpr,
    KP: tl.constexpr, LP: tl.constexpr, NPAR: tl.constexpr, CAP: tl.constexpr, SMALL: tl.constexpr,
    CAPT: tl.constexpr, TC: tl.constexpr, FD: tl.constexpr, SB: tl.constexpr, BOUND_ROUNDS: tl.constexpr,
    NPS: tl.constexpr,
    GDC: tl.constexpr = False,
):
    gdc_enter(GDC)
    # Workspace (tws_ptr int64 codes, tws_score_ptr fp64 scores): the pool's two buffers (2 x CAPT), then the
    # chosen nodes (NB). ws_ptr / ws_score_ptr are the serial build's, for a tie.
    top = B * (L - 1)  # the rank path, root side most significant (levels.py's layout keys)
    ri = tl.arange(0, KP)
    # Start bound: BUDGET distinct prefixes' BUDGET-th best score. The whole tree down to depth FD (bushy trees'
    # choice lies there), below it the spine with at most one deviation (rank r >= 1 at one depth j <= d: deep,
    # peaked trees'), compacted into the second pool buffer (free until the first tightening).
    di = tl.arange(0, LP)
    c_d = tl.cumsum(tl.load(vals_ptr + di * K, mask=di < L, other=0.0).to(tl.float64), 0)
    d3 = di[:, None, None]
    j3 = di[None, :, None]
    r3 = ri[None, None, :]
    vj = tl.load(vals_ptr + j3 * K + r3, mask=(j3 < L) & (r3 < K), other=0.0).to(tl.float64)
    v0 = tl.load(vals_ptr + j3 * K, mask=j3 < L, other=0.0).to(tl.float64)
    fs = c_d[:, None, None] + (vj - v0)  # NaN where a row's best is -inf (zero-probability tokens): left out
    fvalid = (d3 >= FD) & (d3 < L) & (j3 <= d3) & (r3 < K) & ((r3 >= 1) | (j3 == 0)) & (fs == fs)
    fv = tl.reshape(fvalid.to(tl.int32), [LP * LP * KP])
    fpos = tl.cumsum(fv, 0) - fv
    fk = tl.reshape(_key(fs), [LP * LP * KP])
    tl.store(tws_ptr + CAPT + fpos, fk, mask=fv > 0)
    nf = tl.sum(fv, 0)
    a1 = tl.load(vals_ptr + ri, mask=ri < K, other=0.0).to(tl.float64)
    ok1 = (ri < K).to(tl.int32)
    tl.store(tws_ptr + CAPT + nf + tl.cumsum(ok1, 0) - ok1, _key(a1), mask=ok1 > 0)
    nf += tl.sum(ok1, 0)
    if FD >= 2:
        a2 = a1[:, None] + tl.load(vals_ptr + K + ri, mask=ri < K, other=0.0).to(tl.float64)[None, :]
        ok2 = tl.reshape(((ri < K)[:, None] & (ri < K)[None, :] & (L >= 2)).to(tl.int32), [KP * KP])
        tl.store(tws_ptr + CAPT + nf + tl.cumsum(ok2, 0) - ok2, _key(tl.reshape(a2, [KP * KP])), mask=ok2 > 0)
        nf += tl.sum(ok2, 0)
        if FD >= 3:
            a3 = a2[:, :, None] + tl.load(vals_ptr + 2 * K + ri, mask=ri < K, other=0.0).to(tl.float64)[None, None, :]
            ok3 = tl.reshape(((ri < K)[:, None, None] & (ri < K)[None, :, None] & (ri < K)[None, None, :]
                              & (L >= 3)).to(tl.int32), [KP * KP * KP])
            tl.store(tws_ptr + CAPT + nf + tl.cumsum(ok3, 0) - ok3, _key(tl.reshape(a3, [KP * KP * KP])), mask=ok3 > 0)
            nf += tl.sum(ok3, 0)
    tl.debug_barrier()
    t = tl.max(tl.full([2], float("-inf"), tl.float64), 0)
    if nf >= BUDGET:
        si = tl.arange(0, SB)
        t = _bound(_kth(tl.load(tws_ptr + CAPT + si, mask=si < nf, other=_MIN), BUDGET, SB, BOUND_ROUNDS))
    # Depth 0: the root's children scoring >= t.
    cur = nf * 0
    v = tl.load(vals_ptr + ri, mask=ri < K, other=float("-inf")).to(tl.float64)
    ok = (ri < K) & (v >= t)
    pos = tl.cumsum(ok.to(tl.int32), 0) - ok.to(tl.int32)
    tl.store(tws_score_ptr + pos, v, mask=ok)
    tl.store(tws_ptr + pos, ri.to(tl.int64) << top, mask=ok)
    n_pool = tl.sum(ok.to(tl.int32), 0)
    lvl = n_pool * 0  # where the last level starts in the pool
    # The premise (a child never beats its parent) holds for log-probs <= 0; rows with a positive value go serial.
    positive = tl.max(tl.reshape(tl.where((j3 < L) & (r3 < K), vj, -1.0), [LP * KP]), 0) > 0.0
    bad = positive.to(tl.int32)
    tl.debug_barrier()
    for d in range(1, L):
        n_lvl = n_pool - lvl
        if (n_lvl > 0) & (bad == 0):
            base = cur * CAPT
            if n_lvl <= NPS:
                cnt = _level(vals_ptr, tws_ptr + base, tws_score_ptr + base, lvl, n_lvl, n_pool, d, t, top, K, KP, B, NPS)
            else:
                cnt = _level(vals_ptr, tws_ptr + base, tws_score_ptr + base, lvl, n_lvl, n_pool, d, t, top, K, KP, B, NPAR)
            lvl = n_pool
            n_pool = n_pool + cnt
            tl.debug_barrier()
            if (n_pool > CAP) | (cnt > NPAR):
                t = tl.maximum(t, _bound(_pool_kth(tws_score_ptr + base, n_pool, BUDGET, SMALL, CAPT, BOUND_ROUNDS)))
                other = (1 - cur) * CAPT
                kept, at_d = _compact(tws_score_ptr + base, tws_ptr + base, tws_score_ptr + other, tws_ptr + other,
                                      n_pool, t, d, CAPT)
                n_pool = kept
                lvl = kept - at_d
                cur = 1 - cur
                bad = ((n_pool > CAP) | (at_d > NPAR)).to(tl.int32)
                tl.debug_barrier()
    # The cut at the pool's BUDGET-th best score t_fin: every entry above it is chosen; of the entries tied at
    # t_fin, when the budget splits them, the first `need` in the heap's order (`_tied_order`).
    base = cur * CAPT
    chosen = 2 * CAPT
    n_g = tl.minimum(n_pool, BUDGET)
    if n_pool <= SMALL:
        bad = _cut(vals_ptr, tws_ptr, tws_score_ptr, base, (1 - cur) * CAPT, chosen, n_pool, n_g, t, bad, top, BUDGET,
                   K, B, NB, TC, SMALL)
    else:
        bad = _cut(vals_ptr, tws_ptr, tws_score_ptr, base, (1 - cur) * CAPT, chosen, n_pool, n_g, t, bad, top, BUDGET,
                   K, B, NB, TC, CAPT)
    tl.store(flag_ptr, bad.to(tl.int64))
    tl.debug_barrier()
    if bad != 0:
        _build_tree(vals_ptr, ids_ptr, root_ptr, L, spine, ws_ptr, ws_score_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr,
                    score_ptr, n_ptr, BUDGET, K, B, NB, NP, COLS, SD, SR, SC, KNONE)
    else:
        _write_sorted_tree(tws_ptr + chosen, tws_score_ptr + chosen, n_g, top, root_ptr, ids_ptr, tok_ptr, par_ptr,
                           dep_ptr, rank_ptr, score_ptr, n_ptr, BUDGET, K, B, NB, NP)


def fitting_constants(budget: int, k: int, depths: int) -> dict | None:
    """`threshold_constants` where the threshold build takes the shape, else None: its pool and start-bound vectors
    up to MAX_VECTOR entries (one program's; budget 256 with K 8 uses 4,096; up to budget 512 fits at K 8). Other
    shapes build serially."""
    c = threshold_constants(budget, k, depths)
    fits = c["CAPT"] <= MAX_VECTOR and c["LP"] * c["LP"] * c["KP"] <= MAX_VECTOR and c["KP"] ** c["FD"] <= 512
    return c if fits else None


MAX_VECTOR = 8192


def threshold_constants(budget: int, k: int, depths: int) -> dict:
    """The threshold build's own constexprs (besides the serial build's `launch_constants`)."""
    nb = triton.next_power_of_2(budget)
    kp = triton.next_power_of_2(k)
    npar = max(nb, 8)
    cap = max(2048, 2 * nb)
    capt = triton.next_power_of_2(cap + npar * kp)
    fd = min(3, depths, max([d for d in (1, 2, 3) if k**d <= 512], default=1))  # the whole tree down to this depth in the start bound
    n_dev = sum((d + 1) * (k - 1) + 1 for d in range(fd, depths))
    n_full = sum(k ** (d + 1) for d in range(fd))
    sb = triton.next_power_of_2(n_dev + n_full)
    capt = max(capt, sb)  # the start bound's keys go to the second pool buffer
    assert triton.next_power_of_2(depths) * TIED_CAP <= capt  # the tie order's scratch rows, in the free pool buffer
    return dict(KP=kp, LP=triton.next_power_of_2(depths), NPAR=npar, CAP=cap, SMALL=min(capt, max(64, 2 * nb)), CAPT=capt,
                TC=TIED_CAP, FD=fd, SB=sb, BOUND_ROUNDS=BOUND_ROUNDS,
                NPS=min(npar, NARROW_LEVEL))
