"""A threshold build, prototype (selection only, no layout, no spine): the heap's chosen set with few
dependent steps, timed against the serial build on the H200.

The heap pops in non-increasing score order (a proposal never beats its proposer), so without an exact tie
at the budget's boundary its choice is the B best-scoring prefixes. Any B distinct prefixes give a lower
bound t <= t* (the B-th best score); every prefix scoring >= t* has ancestors scoring no less, so a
level-by-level enumeration of the prefixes scoring >= t (children of the kept level, filtered, compacted
by a cumulative sum) holds the whole choice. The start bound comes from the spine with at most one
deviation (~L * L * K / 2 prefixes, scored at once, a margin below for rounding); when the pool outgrows
CAP, or a level NPAR, t is raised to the B-th best of the pool (a radix select, 4-bit digits,
tl.histogram) and the pool compacted. At the end the pool's B-th best is the cut; more than B at or
above it is an exact tie at the boundary: flag (the serial build would run).

    python benchmarks/results/build_threshold_20261204.py [--out DIR]   # H200: exactness at real shapes, timings
    TRITON_INTERPRET=1 python benchmarks/results/build_threshold_20261204.py   # CPU: small capacities, exactness
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "engine_patches" / "ddtree_engine" / "src"))
from ddtree_engine.kernels.tree_build import reference  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET", "0") == "1"
_MIN = tl.constexpr(-9223372036854775807 - 1)


@triton.jit
def _key(s):
    s = tl.where(s == 0.0, 0.0, s)
    b = s.to(tl.int64, bitcast=True)
    return b ^ ((b >> 63) & 0x7FFFFFFFFFFFFFFF)


@triton.jit
def _unkey(k):
    b = k ^ ((k >> 63) & 0x7FFFFFFFFFFFFFFF)
    return b.to(tl.float64, bitcast=True)


@triton.jit
def _kth(x, KSEL, N: tl.constexpr):
    """The KSEL-th largest of the int64 keys x [N] (sentinels _MIN count as keys): radix select, 4-bit digits."""
    u = (x ^ _MIN).to(tl.uint64, bitcast=True)
    bins = tl.arange(0, 32)
    alive = tl.full([N], 1, tl.int1)
    rem = KSEL
    kth = tl.zeros([1], dtype=tl.uint64).sum(0) * 0
    for r in tl.static_range(16):
        shift = 60 - 4 * r
        digit = ((u >> shift) & 15).to(tl.int32)
        digit = tl.where(alive, digit, 16)
        hist = tl.histogram(digit, 32)
        counts = tl.where(bins < 16, hist, 0)
        gt = tl.sum(counts, 0) - tl.cumsum(counts, 0)
        hit = (bins < 16) & (gt < rem) & (gt + counts >= rem)
        dsel = tl.max(tl.where(hit, bins, -1), 0)
        rem = rem - tl.sum(tl.where(bins == dsel, gt, 0), 0)
        alive = alive & (digit == dsel)
        kth = kth | (dsel.to(tl.uint64) << shift)
    return kth.to(tl.int64, bitcast=True) ^ _MIN


@triton.jit
def _pool_kth(ps_ptr, n, KSEL, SMALL: tl.constexpr, CAPT: tl.constexpr):
    if n <= SMALL:
        i1 = tl.arange(0, SMALL)
        k1 = tl.where(i1 < n, _key(tl.load(ps_ptr + i1, mask=i1 < n, other=0.0)), _MIN)
        kth = _kth(k1, KSEL, SMALL)
    else:
        i2 = tl.arange(0, CAPT)
        k2 = tl.where(i2 < n, _key(tl.load(ps_ptr + i2, mask=i2 < n, other=0.0)), _MIN)
        kth = _kth(k2, KSEL, CAPT)
    return kth


@triton.jit
def _compact(ps_ptr, pc_ptr, qs_ptr, qc_ptr, n, t, d, CAPT: tl.constexpr):
    """Pool entries scoring >= t, in order, to the other buffer; (kept, kept at depth d)."""
    i = tl.arange(0, CAPT)
    s = tl.load(ps_ptr + i, mask=i < n, other=float("-inf"))
    c = tl.load(pc_ptr + i, mask=i < n, other=0)
    keep = ((i < n) & (s >= t)).to(tl.int32)
    pos = tl.cumsum(keep, 0) - keep
    tl.store(qs_ptr + pos, s, mask=keep > 0)
    tl.store(qc_ptr + pos, c, mask=keep > 0)
    at_d = tl.sum(tl.where((keep > 0) & ((c >> 58) == d), 1, 0), 0)
    return tl.sum(keep, 0), at_d


@triton.jit
def _thresh_select(vals_ptr, L, ws_s, ws_c, out_s, out_c, out_n, BUDGET: tl.constexpr, K: tl.constexpr,
                   KP: tl.constexpr, RB: tl.constexpr, LP: tl.constexpr, NPAR: tl.constexpr, CAP: tl.constexpr,
                   SMALL: tl.constexpr, CAPT: tl.constexpr):
    top = RB * (L - 1)
    ri = tl.arange(0, KP)
    pi = tl.arange(0, NPAR)
    # Start bound: the spine to depth d with at most one deviation (rank r >= 1 at depth j <= d).
    di = tl.arange(0, LP)
    spine = tl.load(vals_ptr + di * K, mask=di < L, other=0.0).to(tl.float64)
    c_d = tl.cumsum(spine, 0)  # spine score to depth d
    d3 = di[:, None, None]
    j3 = di[None, :, None]
    r3 = ri[None, None, :]
    vj = tl.load(vals_ptr + j3 * K + r3, mask=(j3 < L) & (r3 < K), other=0.0).to(tl.float64)
    v0 = tl.load(vals_ptr + j3 * K, mask=j3 < L, other=0.0).to(tl.float64)
    fs = c_d[:, None, None] + (vj - v0)
    fvalid = (d3 < L) & (j3 <= d3) & (r3 < K) & ((r3 >= 1) | (j3 == 0))
    fk = tl.reshape(tl.where(fvalid, _key(fs), _MIN), [LP * LP * KP])
    nf = tl.sum(tl.reshape(fvalid.to(tl.int32), [LP * LP * KP]), 0)
    t = tl.max(tl.full([2], float("-inf"), tl.float64), 0)
    if nf >= BUDGET:
        t0 = _unkey(_kth(fk, BUDGET, LP * LP * KP))
        t = t0 - tl.abs(t0) * 1e-9 - 1e-300  # below any rounding of the sums' order
    # Depth 0.
    cur = nf * 0
    v = tl.load(vals_ptr + ri, mask=ri < K, other=float("-inf")).to(tl.float64)
    ok = (ri < K) & (v >= t)
    pos = tl.cumsum(ok.to(tl.int32), 0) - ok.to(tl.int32)
    tl.store(ws_s + pos, v, mask=ok)
    tl.store(ws_c + pos, ri.to(tl.int64) << top, mask=ok)
    n_pool = tl.sum(ok.to(tl.int32), 0)
    lvl = n_pool * 0
    bad = n_pool * 0
    nt = n_pool * 0  # tightenings
    tl.debug_barrier()
    for d in range(1, L):
        n_lvl = n_pool - lvl
        if (n_lvl > 0) & (bad == 0):
            base = cur * CAPT
            s_par = tl.load(ws_s + base + lvl + pi, mask=pi < n_lvl, other=float("-inf"))
            c_par = tl.load(ws_c + base + lvl + pi, mask=pi < n_lvl, other=0)
            vd = tl.load(vals_ptr + d * K + ri, mask=ri < K, other=float("-inf")).to(tl.float64)
            ch = s_par[:, None] + vd[None, :]
            okc = (pi < n_lvl)[:, None] & (ri < K)[None, :] & (ch >= t)
            code = (c_par & 0x3FFFFFFFFFFFFFF)[:, None] | (ri.to(tl.int64)[None, :] << (top - RB * d)) | ((tl.zeros([KP], dtype=tl.int64) + d)[None, :] << 58)
            okf = tl.reshape(okc.to(tl.int32), [NPAR * KP])
            posf = tl.cumsum(okf, 0) - okf
            cnt = tl.sum(okf, 0)
            tl.store(ws_s + base + n_pool + posf, tl.reshape(ch, [NPAR * KP]), mask=okf > 0)
            tl.store(ws_c + base + n_pool + posf, tl.reshape(code, [NPAR * KP]), mask=okf > 0)
            lvl = n_pool
            n_pool = n_pool + cnt
            tl.debug_barrier()
            if (n_pool > CAP) | (cnt > NPAR):
                t = tl.maximum(t, _unkey(_pool_kth(ws_s + base, n_pool, BUDGET, SMALL, CAPT)))
                other = (1 - cur) * CAPT
                kept, at_d = _compact(ws_s + base, ws_c + base, ws_s + other, ws_c + other, n_pool, t, d, CAPT)
                n_pool = kept
                lvl = kept - at_d
                cur = 1 - cur
                nt = nt + 1
                bad = ((n_pool > CAP) | (at_d > NPAR)).to(tl.int32)
                tl.debug_barrier()
    base = cur * CAPT
    n_out = tl.minimum(n_pool, BUDGET)
    t_fin = t
    if n_pool > BUDGET:
        t_fin = _unkey(_pool_kth(ws_s + base, n_pool, BUDGET, SMALL, CAPT))
    i = tl.arange(0, CAPT)
    s = tl.load(ws_s + base + i, mask=i < n_pool, other=float("-inf"))
    c = tl.load(ws_c + base + i, mask=i < n_pool, other=0)
    keep = ((i < n_pool) & (s >= t_fin)).to(tl.int32)
    n_keep = tl.sum(keep, 0)
    bad = bad | (n_keep != n_out).to(tl.int32)
    pos = tl.cumsum(keep, 0) - keep
    tl.store(out_s + pos, s, mask=(keep > 0) & (pos < BUDGET))
    tl.store(out_c + pos, c, mask=(keep > 0) & (pos < BUDGET))
    o = tl.arange(0, 4)
    tl.store(out_n + o, tl.where(o == 0, n_out, tl.where(o == 1, bad, nt)), mask=o < 3)


class Threshold:
    def __init__(self, L, K, budget, device, npar=256, cap=2048, small=1024):
        self.L, self.K, self.budget = L, K, budget
        self.rb = max(1, (K - 1).bit_length())
        self.kp = triton.next_power_of_2(K)
        self.lp = triton.next_power_of_2(L)
        self.npar, self.cap = npar, cap
        self.capt = triton.next_power_of_2(cap + npar * self.kp)
        self.small = min(small, self.capt)
        self.ws_s = torch.empty(2 * self.capt, dtype=torch.float64, device=device)
        self.ws_c = torch.empty(2 * self.capt, dtype=torch.int64, device=device)
        self.out_s = torch.empty(budget, dtype=torch.float64, device=device)
        self.out_c = torch.empty(budget, dtype=torch.int64, device=device)
        self.out_n = torch.zeros(3, dtype=torch.int32, device=device)

    def __call__(self, vals, num_warps=8):
        _thresh_select[(1,)](vals, self.L, self.ws_s, self.ws_c, self.out_s, self.out_c, self.out_n,
                             BUDGET=self.budget, K=self.K, KP=self.kp, RB=self.rb, LP=self.lp, NPAR=self.npar,
                             CAP=self.cap, SMALL=self.small, CAPT=self.capt, num_warps=num_warps)

    def chosen(self):
        n, bad, _ = self.out_n.tolist()
        codes = self.out_c[:n].tolist()
        return bad, sorted(codes)


def ref_codes(vals, budget, rb):
    L = len(vals)
    top = rb * (L - 1)
    chosen = reference.select_prefixes(vals, budget, 0)
    codes = []
    for i, (d, r, p, _s) in enumerate(chosen):
        code = r << (top - rb * d)
        q = p
        while q >= 0:
            dq, rq, pq, _ = chosen[q]
            code |= rq << (top - rb * dq)
            q = pq
        codes.append(code | (d << 58))
    return sorted(codes)


def make_vals(kind, L, K, rng):
    if kind == "random":
        x = torch.tensor([[rng.gauss(0, 3) for _ in range(K)] for _ in range(L)], dtype=torch.float64)
    elif kind == "peaked":
        x = torch.tensor([[rng.gauss(0, 1) for _ in range(K)] for _ in range(L)], dtype=torch.float64)
        x[:, 0] += 8
    elif kind == "mild":
        x = torch.tensor([[rng.gauss(0, 1) for _ in range(K)] for _ in range(L)], dtype=torch.float64)
        x[:, 0] += 2.5
    else:  # ties
        x = torch.tensor([[float(rng.randint(0, 3)) for _ in range(K)] for _ in range(L)], dtype=torch.float64)
    return x.log_softmax(1).sort(dim=1, descending=True).values


def check(device, shapes, kinds, seeds, **kw):
    rng = random.Random(0)
    stats = {"equal": 0, "flagged": 0, "wrong": 0}
    for L, K, B in shapes:
        th = Threshold(L, K, B, device, **kw)
        for kind in kinds:
            for _ in range(seeds):
                vals = make_vals(kind, L, K, rng)
                th(vals.to(device))
                bad, codes = th.chosen()
                want = ref_codes(vals.tolist(), B, th.rb)
                if bad:
                    stats["flagged"] += 1
                    stats[f"flagged_{kind}"] = stats.get(f"flagged_{kind}", 0) + 1
                elif codes == want:
                    stats["equal"] += 1
                else:
                    stats["wrong"] += 1
                    print("WRONG", L, K, B, kind, len(codes), len(want))
    return stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not INTERP else "cpu")
    kinds = ("random", "peaked", "mild", "ties")
    if device.type != "cuda":
        # Small capacities force the tightening and its compaction.
        print(check(device, [(4, 3, 10), (5, 4, 20), (6, 2, 30)], kinds, 3, npar=16, cap=32, small=64))
        print(check(device, [(4, 3, 10), (3, 4, 100)], kinds, 2, npar=64, cap=128, small=128))
        return
    rows = {}
    rows["exact_default"] = check(device, [(15, 8, 256), (15, 8, 64), (15, 8, 15), (8, 4, 100), (10, 16, 256)], kinds, 10)
    rows["exact_small_caps"] = check(device, [(15, 8, 256)], kinds, 10, npar=256, cap=512, small=512)
    print(rows)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from build_threshold_primitives_20261204 import graph_us
    from ddtree_engine.kernels.tree_build import kernel as bk
    rng = random.Random(1)
    ids = torch.arange(15 * 8, device=device).view(15, 8)
    root = torch.zeros(1, dtype=torch.int64, device=device)
    timing = []
    for B in (256, 128, 64):
        for kind in ("random", "peaked", "mild"):
            vals = make_vals(kind, 15, 8, rng).to(device)
            th = Threshold(15, 8, B, device)
            th(vals)
            flagged = th.chosen()[0]
            tightenings = th.out_n[2].item()
            outs = bk.build_tree_arrays(vals, ids, B, root)
            serial = graph_us(lambda: bk.build_tree_arrays(vals, ids, B, root, out=outs), 20, 30)
            row = {"budget": B, "logits": kind, "serial_us": serial, "flagged": flagged, "tightenings": tightenings}
            for w in (4, 8, 16):
                row[f"threshold_w{w}_us"] = graph_us(lambda: th(vals, w), 20, 30)
            timing.append(row)
            print(row)
    if args.out:
        Path(args.out, "build_threshold_20261204.json").write_text(json.dumps({"exact": rows, "timing": timing}, indent=1))


if __name__ == "__main__":
    main()
