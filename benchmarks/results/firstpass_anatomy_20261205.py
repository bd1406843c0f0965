"""Where the top-K first pass's ~8 us go (issue 10: budget 15 <= 1.2x the argmax), on the H200.

A copy of kernels/topk_logprobs `_chunk_keys` (GROUP > 1 path) with a MODE constexpr that stops after each part:
  0 load + group max + block max (what any pass that reads the logits pays)
  1 + the sum of exp in fp32
  2 + the sum in fp64 per token (the kernel's sum)
  3 + group keys and the first selection (tl.topk over BLOCK / GROUP int64 keys)
  4 the whole first pass (must equal the kernel's keys)
  5 as 4, the sum in fp32 within a group, fp64 across groups (GROUP x fewer conversions)
  6 as 5, both selections over int32 keys (bf16 only: a bf16 logit widened to fp32 has 16 zero low bits, so its
    order-preserving bits' high half and a 16-bit local index make one int32 key; +inf as the 0x7F80 pattern),
    widened to the kernel's int64 keys at the store (must equal the kernel's keys); the kernel's own `_keys32` and
    `_wide_keys` since 4a33f9a (this script held copies of them, written before the kernel had them)
  7 as 6, each selection K rounds of "max, then drop it" (`_best_keys`) instead of `tl.topk`: less than half the
    shuffles in the sm_90 SASS (308 against 732 at 4096 / 8 / 4 warps), but a chain of K block-wide reductions
The "kernel" column is kernels/topk_logprobs' first pass as it runs by default (since 0583fcc: 32-bit keys on bf16).
Each launch is captured 20 times in one CUDA graph; per launch = replay / 20 (do_bench median).

    PYTHONPATH=engine_patches/ddtree_engine/src python benchmarks/results/firstpass_anatomy_20261205.py
"""
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from ddtree_engine.kernels.topk_logprobs import kernel as tk

L, V, K = 15, 151_936, 8
_S = tl.constexpr(-9223372036854775807)
_S32 = tl.constexpr(-2147483647)


@triton.jit
def _anatomy(logits_ptr, stride_row, V, NCHUNK, keys_ptr, max_ptr, sum_ptr,
             K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr, GROUP: tl.constexpr, MODE: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    base_row = logits_ptr + row.to(tl.int64) * stride_row
    NG: tl.constexpr = BLOCK // GROUP
    first = chunk * BLOCK + tl.arange(0, NG) * GROUP
    offs2 = first[:, None] + tl.arange(0, GROUP)[None, :]
    valid2 = offs2 < V
    x2 = tk._widen(tl.load(base_row + offs2, mask=valid2, other=float("-inf")))
    gmax = tl.max(x2, axis=1)
    m = tl.max(gmax, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    base = (row * NCHUNK + chunk) * KP
    if MODE == 0:
        s = m_safe.to(tl.float64)
    elif MODE == 1:
        s = tl.sum(tl.sum(tl.where(valid2, tl.exp(x2 - m_safe), 0.0), axis=1), axis=0).to(tl.float64)
    elif MODE == 2 or MODE == 3 or MODE == 4:
        s = tl.sum(tl.sum(tl.where(valid2, tl.exp(x2 - m_safe), 0.0).to(tl.float64), axis=1), axis=0)
    else:
        s = tl.sum(tl.sum(tl.where(valid2, tl.exp(x2 - m_safe), 0.0), axis=1).to(tl.float64), axis=0)
    if MODE == 3:
        gkey = tk._keys(gmax, first, first < V)
        tl.store(keys_ptr + base + tl.arange(0, KP), tk._top_keys(gkey, K, KP))
    if MODE == 4 or MODE == 5:
        gkey = tk._keys(gmax, first, first < V)
        chosen = tk._top_keys(gkey, K, KP)
        real = chosen != _S
        cand = (0x7FFFFFFF - (chosen & 0xFFFFFFFF)).to(tl.int32)
        coffs = cand[:, None] + tl.arange(0, GROUP)[None, :]
        cvalid = real[:, None] & (coffs < V)
        cx = tk._widen(tl.load(base_row + coffs, mask=cvalid, other=float("-inf")))
        key = tl.reshape(tk._keys(cx, coffs, cvalid), [KP * GROUP])
        tl.store(keys_ptr + base + tl.arange(0, KP), tk._top_keys(key, K, KP))
    if MODE == 6 or MODE == 7:
        glocal = tl.arange(0, NG) * GROUP
        gkey = tk._keys32(gmax, glocal, first < V, 16)
        if MODE == 6:
            chosen = tl.topk(gkey, KP)
        else:
            chosen = tk._best_keys(gkey, K, KP)
        real = chosen != _S32
        cand = 0xFFFF - (chosen & 0xFFFF)
        clocal = cand[:, None] + tl.arange(0, GROUP)[None, :]
        coffs = chunk * BLOCK + clocal
        cvalid = real[:, None] & (coffs < V)
        cx = tk._widen(tl.load(base_row + coffs, mask=cvalid, other=float("-inf")))
        key = tl.reshape(tk._keys32(cx, clocal, cvalid, 16), [KP * GROUP])
        if MODE == 6:
            best = tl.topk(key, KP)
        else:
            best = tk._best_keys(key, K, KP)
        tl.store(keys_ptr + base + tl.arange(0, KP), tk._wide_keys(best, chunk * BLOCK, 16))
    tl.store(max_ptr + row * NCHUNK + chunk, m)
    tl.store(sum_ptr + row * NCHUNK + chunk, s)


def per_launch(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    many = torch.cuda.CUDAGraph()
    with torch.cuda.graph(many):
        for _ in range(reps):
            fn()
    return do_bench(many.replay, warmup=25, rep=150, return_mode="median") * 1e3 / reps


def main():
    dev = "cuda"
    torch.manual_seed(0)
    x = (torch.randn(L, V, device=dev) * 3).to(torch.bfloat16)
    # ties and non-finite values in a second input, for the equality checks only
    y = x.clone()
    y[0, 1000:1100] = 7.5
    y[1, 5] = float("inf")
    y[1, 77_000] = float("inf")
    y[2, :] = float("-inf")
    y[3, 9] = float("nan")
    y[4, 4096 * 3 + 7] = 3.3895313892515355e38  # bf16's largest finite, below +inf's FLT_MAX
    y[4, 100] = float("inf")
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    amax = torch.empty(L, dtype=torch.int64, device=dev)
    t_arg = per_launch(lambda: torch.argmax(x, -1, out=amax))
    print(f"torch argmax per launch in a graph of 20: {t_arg:.2f} us")
    for block, group, warps in [(4096, 8, 4), (4096, 16, 4), (2048, 8, 2), (1024, 8, 1), (1024, 8, 2)]:
        c = tk.first_pass_constants(V, K, block, group)
        nch = triton.cdiv(V, block)
        ref = tk.first_pass_buffers(L, nch, c["KP"], dev)
        bufs = tk.first_pass_buffers(L, nch, c["KP"], dev)
        t_kernel = per_launch(lambda: tk.first_pass(x, K, block=block, group=group, num_warps=warps, out=ref, pdl=False))
        line = [f"{block}/{group}/{warps}w kernel {t_kernel:5.2f}"]
        for mode in range(8):
            def go(inp=x, mode=mode):
                _anatomy[(L, nch)](inp, inp.stride(0), V, nch, *bufs, K=K, KP=c["KP"], BLOCK=c["BLOCK"], GROUP=c["GROUP"],
                                   MODE=mode, num_warps=warps)
            t = per_launch(go)
            ok = ""
            if mode in (4, 5, 6, 7):
                for inp in (x, y):
                    tk.first_pass(inp, K, block=block, group=group, num_warps=warps, out=ref, pdl=False)
                    bufs[0].fill_(123)
                    go(inp)
                    torch.cuda.synchronize()
                    same = torch.equal(bufs[0][..., :K], ref[0][..., :K]) and torch.equal(bufs[1], ref[1])
                    close = torch.allclose(bufs[2], ref[2], rtol=1e-6, atol=0)
                    ok += "=" if same and close else "X"
            line.append(f"m{mode} {t:5.2f}{ok}")
        print("  ".join(line), flush=True)
    print("# m4-m7 suffix: = where keys, maxes and sums (rtol 1e-6) equal the kernel's on random and on edge logits")


if __name__ == "__main__":
    sys.exit(main())
