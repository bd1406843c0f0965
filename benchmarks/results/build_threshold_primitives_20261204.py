"""Primitive costs of a threshold build at budget 256 (H200, one program, CUDA graph of R launches).

- level: one threshold-filter level of 256 parents x 8 children (children scored, compared with a
  threshold, compacted by a cumulative sum, scattered to the next level's buffer, a barrier); NLEV levels
  in one launch, so per level = (NLEV run - 1-level run) / (NLEV - 1).
- topk: the 256-th largest of N int64 keys by tl.topk(keys, 256).
- radix: the same by a radix select (BITS-bit digits, tl.histogram per round, 64 / BITS rounds).
- serial: today's serial build at budget 256 on random logits, same run.

The capture takes bench_tree_step.graphed since the run (its side-stream warm-up runs all reps calls, not one);
not re-run on the GPU after that change.

    python benchmarks/results/build_threshold_primitives_20261204.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "engine_patches" / "ddtree_engine" / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_tree_step import graphed  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _levels(ws_ptr, vals_ptr, t, n_ptr, NLEV: tl.constexpr, NP: tl.constexpr, K: tl.constexpr):
    pi = tl.arange(0, NP)
    ri = tl.arange(0, K)
    fl = tl.arange(0, NP * K)
    n = tl.program_id(0) * 0 + 1
    tl.store(ws_ptr + pi, tl.where(pi == 0, 0.0, float("-inf")).to(tl.float64))
    tl.debug_barrier()
    for d in range(NLEV):
        src = (d % 2) * NP
        dst = ((d + 1) % 2) * NP
        s = tl.load(ws_ptr + src + pi, mask=pi < n, other=float("-inf"))
        v = tl.load(vals_ptr + d * K + ri).to(tl.float64)
        c = tl.reshape(s[:, None] + v[None, :], [NP * K])
        keep = (c >= t).to(tl.int32)
        pos = tl.cumsum(keep, 0) - keep
        tl.store(ws_ptr + dst + pos, c, mask=(keep > 0) & (pos < NP))
        n = tl.minimum(tl.sum(keep, 0), NP)
        tl.debug_barrier()
    tl.store(n_ptr + fl * 0, n, mask=fl == 0)


@triton.jit
def _topk_kth(keys_ptr, out_ptr, N: tl.constexpr, KSEL: tl.constexpr):
    x = tl.load(keys_ptr + tl.arange(0, N))
    top = tl.topk(x, KSEL)
    j = tl.arange(0, KSEL)
    kth = tl.min(tl.where(j == KSEL - 1, top, 9223372036854775807), 0)
    tl.store(out_ptr + j * 0, kth, mask=j == 0)


@triton.jit
def _radix_kth(keys_ptr, out_ptr, N: tl.constexpr, KSEL: tl.constexpr, BITS: tl.constexpr):
    NB: tl.constexpr = 1 << BITS
    x = tl.load(keys_ptr + tl.arange(0, N))
    # Unsigned order: flip the sign bit, then compare as unsigned through (u >> s) & mask digits.
    u = (x ^ (-9223372036854775807 - 1)).to(tl.uint64, bitcast=True)
    bins = tl.arange(0, 2 * NB)
    alive = tl.full([N], 1, tl.int1)
    rem = tl.program_id(0) * 0 + KSEL
    kth = tl.zeros([1], dtype=tl.uint64).sum(0) * 0
    for r in tl.static_range(64 // BITS):
        shift = 64 - BITS * (r + 1)
        digit = ((u >> shift) & (NB - 1)).to(tl.int32)
        digit = tl.where(alive, digit, NB)
        hist = tl.histogram(digit, 2 * NB)
        counts = tl.where(bins < NB, hist, 0)
        total = tl.sum(counts, 0)
        gt = total - tl.cumsum(counts, 0)  # keys in higher digits
        hit = (bins < NB) & (gt < rem) & (gt + counts >= rem)
        dsel = tl.max(tl.where(hit, bins, -1), 0)
        rem = rem - tl.sum(tl.where(bins == dsel, gt, 0), 0)
        alive = alive & (digit == dsel)
        kth = kth | (dsel.to(tl.uint64) << shift)
    res = (kth.to(tl.int64, bitcast=True)) ^ (-9223372036854775807 - 1)
    j = tl.arange(0, 2)
    tl.store(out_ptr + j * 0, res + j * 0, mask=j == 0)


def graph_us(fn, reps: int, iters: int) -> float:
    """Microseconds per call of fn: reps calls captured in one CUDA graph (bench_tree_step.graphed), replayed."""

    def calls():
        for _ in range(reps):
            fn()

    g = graphed(calls)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / iters / reps)
    return sorted(times)[len(times) // 2]


def check(device):
    """Correctness of the two selections against torch (small and real sizes)."""
    g = torch.Generator().manual_seed(0)
    for n in (1024, 2048) if not INTERP else (256,):
        ksel = 256 if not INTERP else 32
        for case in range(4):
            if case == 3:
                x = torch.randint(-5, 5, (n,), generator=g).to(torch.int64)
            else:
                x = (torch.randn(n, generator=g, dtype=torch.float64) * 10 ** case).view(torch.int64)
                x = torch.where(x < 0, x ^ 0x7FFFFFFFFFFFFFFF, x)  # order-preserving image of the doubles
            want = torch.topk(x, ksel).values[-1].item()
            xs = x.to(device)
            for name, fn in (("topk", lambda o: _topk_kth[(1,)](xs, o, N=n, KSEL=ksel)),
                             ("radix8", lambda o: _radix_kth[(1,)](xs, o, N=n, KSEL=ksel, BITS=8)),
                             ("radix4", lambda o: _radix_kth[(1,)](xs, o, N=n, KSEL=ksel, BITS=4))):
                out = torch.zeros(1, dtype=torch.int64, device=device)
                fn(out)
                got = out.item()
                assert got == want, (name, n, case, got, want)
    print("selections agree with torch.topk")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not INTERP else "cpu")
    check(device)
    if device.type != "cuda":
        ws = torch.empty(2 * 256, dtype=torch.float64)
        vals = torch.randn(15, 8, dtype=torch.float64).sort(dim=1, descending=True).values
        n = torch.zeros(1, dtype=torch.int32)
        _levels[(1,)](ws, vals, -1e30, n, NLEV=3, NP=256, K=8)
        assert n.item() == 256, n
        print("levels ran")
        return
    rows = []
    fill = torch.empty(1, device=device)
    rows.append({"what": "replay floor (fill)", "us": graph_us(lambda: fill.fill_(1.0), 20, 50)})
    vals = torch.randn(15, 8, dtype=torch.float64, device=device).sort(dim=1, descending=True).values
    ws = torch.empty(2 * 256, dtype=torch.float64, device=device)
    n = torch.zeros(1, dtype=torch.int32, device=device)
    for warps in (4, 8):
        for nlev in (1, 15):
            us = graph_us(lambda: _levels[(1,)](ws, vals, -1e30, n, NLEV=nlev, NP=256, K=8, num_warps=warps), 20, 50)
            rows.append({"what": f"levels NLEV={nlev} warps={warps}", "us": us})
    keys = {nk: torch.randn(nk, dtype=torch.float64, device=device).view(torch.int64) for nk in (1024, 2048, 4096)}
    out = torch.zeros(1, dtype=torch.int64, device=device)
    for nk, x in keys.items():
        for warps in (4, 8):
            rows.append({"what": f"topk N={nk} warps={warps}",
                         "us": graph_us(lambda: _topk_kth[(1,)](x, out, N=nk, KSEL=256, num_warps=warps), 20, 50)})
            for bits in (4, 8):
                rows.append({"what": f"radix{bits} N={nk} warps={warps}",
                             "us": graph_us(lambda: _radix_kth[(1,)](x, out, N=nk, KSEL=256, BITS=bits, num_warps=warps), 20, 50)})
    from ddtree_engine.kernels.tree_build import kernel as bk
    bvals = (torch.randn(15, 8, dtype=torch.float64, device=device) * 3).log_softmax(1).sort(dim=1, descending=True).values
    peaked = bvals.clone()
    peaked[:, 0] = -0.01
    ids = torch.arange(15 * 8, device=device).view(15, 8)
    root = torch.zeros(1, dtype=torch.int64, device=device)
    for name, v in (("random", bvals), ("peaked", peaked)):
        outs = bk.build_tree_arrays(v, ids, 256, root)
        rows.append({"what": f"serial build 256 {name}", "us": graph_us(lambda: bk.build_tree_arrays(v, ids, 256, root, out=outs), 20, 30)})
    for r in rows:
        print(f"{r['what']:>32} {r['us']:8.2f} us")
    if args.out:
        Path(args.out, "build_threshold_primitives_20261204.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
