"""Triton kernel: the serial build's tree (kernel.py), selected by a threshold (`method="threshold"`; TreeStep's
default from budget 256, tree_step.THRESHOLD_FROM_BUDGET).

The heap pops its whole order (-score, depth, rank, the parent's order; reference.select_by_levels), and scores in
non-increasing order (log-probs are <= 0, so a proposal never beats its proposer), so its choice is the BUDGET
best-scoring prefixes, an exact tie at the budget's boundary cut by that order. Any BUDGET distinct prefixes give a
lower bound t on the BUDGET-th best score t*, and every prefix scoring >= t* has ancestors scoring no less, so a
level-by-level enumeration of the prefixes scoring >= t holds the whole choice: each level is the kept level's
children filtered by t and compacted by a cumulative sum, no ranking.

- Start bound: the BUDGET-th best of distinct prefixes scored at once: the whole tree down to depth FD (K**FD <=
  512: bushy trees' choice lies there), and deeper the spine with at most one deviation (rank r >= 1 at one depth
  j <= d: peaked trees'), by a radix select truncated to BOUND_ROUNDS digits (a lower key: still a bound), less a
  margin for sums added in another order.
- The pool (every prefix enumerated so far scoring >= t) has room for CAP; when it passes CAP, or a level
  passes NPAR parents, t rises to a bound of the pool's BUDGET-th best (`_kth`: a radix select, 4-bit digits,
  one `tl.histogram` a round) and the pool is compacted.
- The cut: the pool's BUDGET-th best t_fin, exactly. Every entry above it is chosen; when the budget splits the
  entries tied at t_fin, `_tied_order` takes the first in the heap's order (up to TIED_CAP of them). The serial
  build (`_build_tree`) runs in the same launch instead for larger ties, for a tightening that leaves a level or
  the pool too large (massive ties: integer logits), and for rows with a positive value; `fell_back` says so.
  Shapes whose vectors pass MAX_VECTOR (`fitting_constants`: budget 1,024 at K 8, K 256) build serially (kernel.py).

Then the layout as the levels build's: layout keys (depth above `_KEY_BITS`, the rank path below), a node's place
1 + the number of chosen keys below its own.

H200, 2026-12-04 (benchmarks/results/build_threshold_cut_20261204.{py,txt,json}, bf16 [15, 151,936] logits, 7
draws, TIED_CAP 64 then): whole step in a CUDA graph at budget 256 89.8-95.1 us against the serial build's
121.7-125.4, the serial step's arrays on every draw with no fallback (ties split at the cut on 5 of them); slower at
64 and mostly at 128. A split tie costs its order ~40 us at TIED_CAP 64 ([64, 64] comparisons spill) and ~26 at 32
(budget 64: build 44.6 us against 58.9, 18.4 with no split; build_threshold_tiecap_20261204.{py,txt}).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernel import _build_tree
from .layout import _KEY_BITS, _write_keyed_tree

_MIN = tl.constexpr(-9223372036854775807 - 1)
# Prefixes tied at the cut that the kernel orders itself (`_tied_order`, [TIED_CAP, TIED_CAP] comparisons); more
# than this, split by the budget, go to the serial build.
TIED_CAP = 32


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
def _kth(x, KSEL, N: tl.constexpr, ROUNDS: tl.constexpr = 16):
    """The KSEL-th largest of the int64 keys x [N] (_MIN pads count as keys, below every real one): a radix
    select on the keys as unsigned, 4-bit digits from the top, one histogram a round. With ROUNDS < 16 the
    smallest key sharing its top 4 * ROUNDS bits: a lower bound, within a relative 2**-(4 * ROUNDS - 12) of
    an fp64 score's key."""
    u = (x ^ _MIN).to(tl.uint64, bitcast=True)
    bins = tl.arange(0, 32)
    alive = tl.full([N], 1, tl.int1)
    rem = KSEL
    kth = tl.zeros([1], dtype=tl.uint64).sum(0) * 0
    for r in tl.static_range(ROUNDS):
        shift = 60 - 4 * r
        digit = ((u >> shift) & 15).to(tl.int32)
        digit = tl.where(alive, digit, 16)  # keys out of the running go to a bin nobody reads
        hist = tl.histogram(digit, 32)
        counts = tl.where(bins < 16, hist, 0)
        above = tl.sum(counts, 0) - tl.cumsum(counts, 0)  # keys in higher digits
        hit = (bins < 16) & (above < rem) & (above + counts >= rem)
        dsel = tl.max(tl.where(hit, bins, -1), 0)
        rem = rem - tl.sum(tl.where(bins == dsel, above, 0), 0)
        alive = alive & (digit == dsel)
        kth = kth | (dsel.to(tl.uint64) << shift)
    return kth.to(tl.int64, bitcast=True) ^ _MIN


@triton.jit
def _pool_kth(ps_ptr, n, KSEL, SMALL: tl.constexpr, CAPT: tl.constexpr, ROUNDS: tl.constexpr = 16):
    """The KSEL-th best score key of the n pool scores at ps_ptr (n >= KSEL), over SMALL keys when they fit
    (a lower bound of it with ROUNDS < 16, `_kth`)."""
    if n <= SMALL:
        i1 = tl.arange(0, SMALL)
        k1 = tl.where(i1 < n, _key(tl.load(ps_ptr + i1, mask=i1 < n, other=0.0)), _MIN)
        kth = _kth(k1, KSEL, SMALL, ROUNDS)
    else:
        i2 = tl.arange(0, CAPT)
        k2 = tl.where(i2 < n, _key(tl.load(ps_ptr + i2, mask=i2 < n, other=0.0)), _MIN)
        kth = _kth(k2, KSEL, CAPT, ROUNDS)
    return kth


@triton.jit
def _bound(kth):
    """A score at most the key kth's (a truncated `_kth`), less a margin for sums added in another order;
    -inf where the key is -inf's (its truncation is a NaN)."""
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
def _tied_order(vals_ptr, code, valid, need, L, top, K: tl.constexpr, B: tl.constexpr, TC: tl.constexpr,
                LP: tl.constexpr):
    """Which of TC prefixes tied at one score (layout codes, `valid` of them) are among the first `need` in the
    heap's order (reference.select_by_levels): shallower first; at one depth, lower rank, then the parents' order
    (higher score, lower rank, then theirs), so the deepest level where two rank paths differ in score or rank
    decides. Each prefix's scores are summed root first, as the pool's (and the reference's) are. The log-probs
    are gathered once ([TC, LP]), and the levels walked only down to the deepest tied prefix's."""
    dep = (code >> _KEY_BITS).to(tl.int32)
    jj = tl.arange(0, LP)
    live2 = valid[:, None] & (jj[None, :] <= dep[:, None])
    r2 = ((code[:, None] >> tl.maximum(top - B * jj[None, :], 0).to(tl.int64)) & ((1 << B) - 1)).to(tl.int32)
    r2 = tl.where(live2, r2, 0)
    v2 = tl.load(vals_ptr + jj[None, :] * K + r2, mask=live2, other=0.0).to(tl.float64)
    s = tl.zeros([TC], dtype=tl.float64)
    first = tl.zeros([TC, TC], dtype=tl.int1)  # row before column, by the deepest level where they differ
    deepest = tl.max(tl.where(valid, dep, 0), 0)
    for j in range(0, deepest + 1):
        at_j = jj[None, :] == j
        live = valid & (j <= dep)
        s = tl.where(live, s + tl.sum(tl.where(at_j, v2, 0.0), 1), s)  # one term is v2[:, j], the rest +0.0
        r = tl.sum(tl.where(at_j, r2, 0), 1)
        sx = s[:, None]
        sy = s[None, :]
        rx = r[:, None]
        ry = r[None, :]
        differ = live[:, None] & live[None, :] & ((sx != sy) | (rx != ry))
        first = tl.where(differ, (sx > sy) | ((sx == sy) & (rx < ry)), first)
    dx = dep[:, None]
    dy = dep[None, :]
    before = valid[:, None] & valid[None, :] & ((dx < dy) | ((dx == dy) & first))
    ahead = tl.sum(before.to(tl.int32), 0)  # per column: the tied prefixes before it
    return valid & (ahead < need)


@triton.jit
def _build_tree_threshold(
    vals_ptr, ids_ptr, root_ptr, L, spine, ws_ptr, ws_score_ptr, tws_ptr, tws_score_ptr,
    tok_ptr, par_ptr, dep_ptr, rank_ptr, score_ptr, n_ptr, flag_ptr,
    BUDGET: tl.constexpr, K: tl.constexpr, B: tl.constexpr, NB: tl.constexpr, NP: tl.constexpr, COLS: tl.constexpr,
    SD: tl.constexpr, SR: tl.constexpr, SC: tl.constexpr, KNONE: tl.constexpr,
    KP: tl.constexpr, LP: tl.constexpr, NPAR: tl.constexpr, CAP: tl.constexpr, SMALL: tl.constexpr,
    CAPT: tl.constexpr, TC: tl.constexpr, FD: tl.constexpr, SB: tl.constexpr, BOUND_ROUNDS: tl.constexpr,
):
    # Workspace (tws_ptr int64 codes, tws_score_ptr fp64 scores): the pool's two buffers (2 x CAPT), then the
    # chosen nodes (NB). ws_ptr / ws_score_ptr are the serial build's, for a tie.
    top = B * (L - 1)  # the rank path, root side most significant (levels.py's layout keys)
    ri = tl.arange(0, KP)
    pi = tl.arange(0, NPAR)
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
            s_par = tl.load(tws_score_ptr + base + lvl + pi, mask=pi < n_lvl, other=float("-inf"))
            c_par = tl.load(tws_ptr + base + lvl + pi, mask=pi < n_lvl, other=0)
            vd = tl.load(vals_ptr + d * K + ri, mask=ri < K, other=float("-inf")).to(tl.float64)
            ch = s_par[:, None] + vd[None, :]  # as the reference adds them
            okc = (pi < n_lvl)[:, None] & (ri < K)[None, :] & (ch >= t)
            path = (c_par & ((tl.zeros([NPAR], dtype=tl.int64) + 1 << _KEY_BITS) - 1))[:, None]
            code = path | (ri.to(tl.int64)[None, :] << (top - B * d)) | ((tl.zeros([KP], dtype=tl.int64) + d)[None, :] << _KEY_BITS)
            okf = tl.reshape(okc.to(tl.int32), [NPAR * KP])
            posf = tl.cumsum(okf, 0) - okf
            cnt = tl.sum(okf, 0)
            tl.store(tws_score_ptr + base + n_pool + posf, tl.reshape(ch, [NPAR * KP]), mask=okf > 0)
            tl.store(tws_ptr + base + n_pool + posf, tl.reshape(code, [NPAR * KP]), mask=okf > 0)
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
    tied_at = chosen + NB
    n_g = tl.minimum(n_pool, BUDGET)
    cut = (n_pool > BUDGET).to(tl.int32)
    t_fin = t
    if cut > 0:
        t_fin = _unkey(_pool_kth(tws_score_ptr + base, n_pool, BUDGET, SMALL, CAPT))
    i = tl.arange(0, CAPT)
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
    pos = tl.cumsum(keep, 0) - keep
    tl.store(tws_score_ptr + chosen + pos, s, mask=(keep > 0) & (pos < NB))
    tl.store(tws_ptr + chosen + pos, c, mask=(keep > 0) & (pos < NB))
    if (split > 0) & (bad == 0):
        tpos = tl.cumsum(ti, 0) - ti
        tl.store(tws_ptr + tied_at + tpos, c, mask=tie)
        tl.debug_barrier()
        tj = tl.arange(0, TC)
        tcode = tl.load(tws_ptr + tied_at + tj, mask=tj < n_tie, other=0)
        sel = _tied_order(vals_ptr, tcode, tj < n_tie, need, L, top, K, B, TC, LP).to(tl.int32)
        spos = n_above + tl.cumsum(sel, 0) - sel
        tl.store(tws_ptr + chosen + spos, tcode, mask=(sel > 0) & (spos < NB))
        tl.store(tws_score_ptr + chosen + spos, tl.zeros([TC], dtype=tl.float64) + t_fin, mask=(sel > 0) & (spos < NB))
    tl.store(flag_ptr, bad.to(tl.int64))
    tl.debug_barrier()
    if bad != 0:
        _build_tree(vals_ptr, ids_ptr, root_ptr, L, spine, ws_ptr, ws_score_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr,
                    score_ptr, n_ptr, BUDGET, K, B, NB, NP, COLS, SD, SR, SC, KNONE)
    else:
        _write_keyed_tree(tws_ptr + chosen, tws_score_ptr + chosen, n_g, top, root_ptr, ids_ptr, tok_ptr, par_ptr,
                          dep_ptr, rank_ptr, score_ptr, n_ptr, BUDGET, K, B, NB, NP, COLS)


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
    return dict(KP=kp, LP=triton.next_power_of_2(depths), NPAR=npar, CAP=cap, SMALL=min(1024, capt), CAPT=capt,
                TC=TIED_CAP, FD=fd, SB=sb, BOUND_ROUNDS=6)
