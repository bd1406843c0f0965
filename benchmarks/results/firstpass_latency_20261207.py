"""Issue 10: what bounds the top-K's first pass, and one cut of its first selection's dependent chain.

The README and topk_logprobs' docstring called the pass issue-bound from sm_90 SASS counts compiled on the CPU
(3,536 instructions a program with 32-bit keys, 5,384 with 64-bit). Those compiles left out what a launch specialises:
V and the row stride (151,936) and the pointers divisible by 16. Without that the loads' mask is not known to be
constant over a group's 8 tokens, so each thread loads its tokens one bf16 at a time (33 LDG.U16) and a group's max
takes shuffles; with it (what the GPU runs at V = 151,936), 128-bit loads and a group per thread. `--counts` (any
host) prints both compiles of each first pass below: SASS instructions, registers, SHFL, BAR, LDG.

On a GPU:
- the first pass alone (topk_logprobs.first_pass, 4096 / 8 / 4 warps), 20 launches in one CUDA graph, per launch, over
  1, 4 and 15 rows of the same logits: if 1 row (38 programs on 132 SMs) costs about what 15 rows (570) cost, the pass
  is bound by one program's dependent chain, not by issue or bandwidth;
- the launched kernel's own registers and SASS count (what the GPU's Triton compiled at these arguments);
- "registers first": the first selection's 512 group keys reordered before `tl.topk` so that its hypercube's innermost
  dimensions are the keys a thread holds (register bits) and the warps' the outermost: the top-K is the same set
  whatever the order, but the sort's and merges' compare-exchanges on the innermost dims need no shuffle
  (SHFL 139 -> 92 a program in the specialised compile, BAR 9 -> 13);
- "rounds": the kernel's selections by K rounds of "max, then drop it" (TreeStep(topk_rounds=True)) at the default
  4096 / 8 / 4 warps, a chain of K block-wide reductions instead of the bitonic network's stages (timed in the step
  before only at 1,024-token blocks on one warp);
- the whole step (TreeStep, PDL, walk; bench_tree_step.compare_arms) with each pass, by budget.

    PYTHONPATH=engine_patches/ddtree_engine/src python benchmarks/results/firstpass_latency_20261207.py [--smoke | --counts]

--smoke (TRITON_INTERPRET=1 on the CPU): the variant's keys, maxes and sums against the kernel's, and the step's arms.

Run on an H100 (2026-12-07 18:42 UTC, firstpass_latency_20261207_h100.txt; --counts: _counts.txt): the launched pass is
1,304 instructions (Triton 3.6; 56 registers, 128-bit loads), a launch 3.37 us over 1 row, 4.00 over 4, 6.44 over 15:
half fixed, the rest about the added rows' issue. Neither cut is faster: alone at 15 rows 8.94 (registers first) and
6.97 us (rounds); the step at budget 15 20.48 us as it is, 20.70 and 21.18 (22: 22.40, 22.30, 22.98), graphed argmax
15.62.
"""
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, as the earlier scripts here
from bench_tree_step import compare_arms, graphed, module_flags  # noqa: E402  (it puts the engine's src on the path)
from ddtree_engine.kernels.gdc import gdc_enter  # noqa: E402
from ddtree_engine.kernels.topk_logprobs import kernel as topk_kernel  # noqa: E402
from ddtree_engine.kernels.topk_logprobs.kernel import (  # noqa: E402
    _block_keys, _key_local, _none, _select, _wide_keys, _widen)

SMOKE = "--smoke" in sys.argv
L, V = (3, 3000) if SMOKE else (15, 151_936)
DEV = "cpu" if SMOKE else "cuda"
TIMING_ROUNDS = 1 if SMOKE else 7
BUDGETS = (5, 22) if SMOKE else (15, 22)


@triton.jit
def _registers_first(gkey, NW: tl.constexpr):
    """The first pass's group keys [NG] (lane = index bits 0-4, warp = the next log2(NW), a thread's registers the
    rest: the layout of the group maxima of a [NG, GROUP] block with a group per thread) reordered so that the
    registers' bits come first, then the lanes', then the warps'. Unchanged where NG < 32 * NW."""
    NG: tl.constexpr = gkey.shape[0]
    NR: tl.constexpr = NG // (32 * NW)
    if NR > 1:
        g = tl.permute(tl.reshape(gkey, [NR, NW, 32]), (1, 2, 0))
        gkey = tl.reshape(g, [NG])
    return gkey


@triton.jit
def _chunk_topk_rf(logits_ptr, stride_row, V, NCHUNK, keys_ptr, max_ptr, sum_ptr, K: tl.constexpr, KP: tl.constexpr,
                   BLOCK: tl.constexpr, GROUP: tl.constexpr, LOWBITS: tl.constexpr = 0, ROUNDS: tl.constexpr = False,
                   GDC: tl.constexpr = False, NW: tl.constexpr = 4):
    """topk_logprobs' `_chunk_topk` (its `_chunk_keys`, GROUP > 1) with the group keys `_registers_first` before the
    first selection: the same keys, maxes and sums."""
    gdc_enter(GDC)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    base_row = logits_ptr + row.to(tl.int64) * stride_row
    start = chunk * BLOCK
    NG: tl.constexpr = BLOCK // GROUP
    glocal = tl.arange(0, NG) * GROUP
    local2 = glocal[:, None] + tl.arange(0, GROUP)[None, :]
    valid2 = start + local2 < V
    x2 = _widen(tl.load(base_row + start + local2, mask=valid2, other=float("-inf")))
    gmax = tl.max(x2, axis=1)
    m = tl.max(gmax, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(tl.sum(tl.where(valid2, tl.exp(x2 - m_safe), 0.0).to(tl.float64), axis=1), axis=0)
    gkey = _block_keys(gmax, start, glocal, start + glocal < V, LOWBITS)
    chosen = _select(_registers_first(gkey, NW), K, KP, ROUNDS)
    real = chosen != _none(chosen)
    cand = _key_local(chosen, start, LOWBITS)
    clocal = cand[:, None] + tl.arange(0, GROUP)[None, :]
    cvalid = real[:, None] & (start + clocal < V)
    cx = _widen(tl.load(base_row + start + clocal, mask=cvalid, other=float("-inf")))
    key = tl.reshape(_block_keys(cx, start, clocal, cvalid, LOWBITS), [KP * GROUP])
    base = (row * NCHUNK + chunk) * KP
    best = _select(key, K, KP, ROUNDS)
    if LOWBITS > 0:
        best = _wide_keys(best, start, LOWBITS)
    tl.store(keys_ptr + base + tl.arange(0, KP), best)
    tl.store(max_ptr + row * NCHUNK + chunk, m)
    tl.store(sum_ptr + row * NCHUNK + chunk, s)


# name: (first-pass kernel, its selections by K rounds instead of tl.topk)
PASSES = {"kernel": (topk_kernel._chunk_topk, False), "registers first": (_chunk_topk_rf, False),
          "kernel, rounds": (topk_kernel._chunk_topk, True)}
ARMS = {"kernel (default)": ({}, {}), "registers first": ({(topk_kernel, "_chunk_topk"): _chunk_topk_rf}, {}),
        "rounds 4096/8/4w": ({}, {"topk_rounds": True})}


def sass_summary(cubin: bytes) -> dict:
    """SASS instructions of a cubin (Triton's cuobjdump / nvdisasm), with registers and a few opcodes' counts."""
    from triton.tools.disasm import get_sass
    sass = get_sass(cubin)
    ops = re.findall(r"^[-0-9a-fY:]+\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", sass, re.M)
    count = Counter(ops)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        tool = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
        usage = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", usage)
    return {"instructions": len(ops), "registers": int(regs.group(1)) if regs else None,
            **{op: count[op] for op in ("SHFL", "BAR", "LDG")}}


def counts() -> None:
    """Each first pass compiled for sm_90 here, without and with the launch's divisibility-16 specialisation of the
    pointers, the row stride and V (both at [15, 151,936] bf16, 4096 / 8 / 4 warps)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    sig = {"logits_ptr": "*bf16", "stride_row": "i32", "V": "i32", "NCHUNK": "i32", "keys_ptr": "*i64",
           "max_ptr": "*fp32", "sum_ptr": "*fp64"}
    print(f"# Triton {triton.__version__}, sm_90, [15, 151,936] bf16, 4096 / 8 / 4 warps")
    for name, (fn, rounds) in PASSES.items():
        for lowbits in (16, 0):
            for spec in (False, True):
                consts = dict(K=8, KP=8, BLOCK=4096, GROUP=8, LOWBITS=lowbits, ROUNDS=rounds, GDC=False,
                              **({"NW": 4} if fn is _chunk_topk_rf else {}))
                attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 4, 5, 6)} if spec else None
                src = ASTSource(fn=fn, signature={**sig, **{c: "constexpr" for c in consts}}, constexprs=consts,
                                attrs=attrs)
                k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
                print(f"{name:>16} {'32' if lowbits else '64'}-bit keys, "
                      f"{'specialised' if spec else 'not specialised'}: {sass_summary(k.asm['cubin'])}")


def alone(logits: torch.Tensor) -> None:
    """Each first pass alone, 20 launches in a CUDA graph, per launch (do_bench median), over 1, 4 and L rows; and the
    launched kernel's own SASS summary."""
    from triton.testing import do_bench
    for name, (fn, rounds) in PASSES.items():
        for rows in (1, 4, L):
            part = logits[:rows]
            out = topk_kernel.first_pass_buffers(rows, triton.cdiv(V, 4096), 8, logits.device)
            with module_flags({(topk_kernel, "_chunk_topk"): fn}):
                launch = lambda p=part, o=out, r=rounds: topk_kernel.first_pass(p, 8, out=o, rounds=r)  # noqa: E731
                launch()
                g = graphed(lambda: [launch() for _ in range(20)])
            us = do_bench(g.replay, warmup=10, rep=200, return_mode="median") * 1e3 / 20
            print(f"first pass alone {name:>16}, {rows:>2} rows ({rows * out[0].shape[1]:>3} programs): "
                  f"{us:6.2f} us a launch")
    kernels = {}  # each kernel once, under its first name ("kernel, rounds" is the kernel with ROUNDS)
    for name, (fn, _) in PASSES.items():
        kernels.setdefault(fn, name)
    for fn, name in kernels.items():  # every compile of each kernel this run launched (Triton's JIT cache)
        try:
            for key, k in fn.device_caches[torch.cuda.current_device()][0].items():
                print(f"  launched {name}: {sass_summary(k.asm['cubin'])}  ({str(key)[:160]})")
        except Exception as exc:  # the cache's shape is Triton's own; the counts above stand without it
            print(f"  launched {name}: no SASS ({type(exc).__name__}: {exc})")


def smoke_passes(logits: torch.Tensor) -> None:
    """The variant's keys, maxes and sums against the kernel's, both selecting by `tl.topk` as on a GPU (`_TOPK` on;
    the interpreter otherwise takes the rounds, which do not see the order)."""
    with module_flags({(topk_kernel, "_TOPK"): tl.constexpr(True)}):
        want = topk_kernel.first_pass(logits, 8)
        with module_flags({(topk_kernel, "_chunk_topk"): _chunk_topk_rf}):
            got = topk_kernel.first_pass(logits, 8)
    same = all(torch.equal(a, b) for a, b in zip(want, got))
    print(f"registers first: keys, maxes and sums {'same' if same else 'MISMATCH'}")
    if not same:
        sys.exit(1)


def main():
    if "--counts" in sys.argv:
        counts()
        return
    torch.manual_seed(0)
    logits = (torch.randn(L, V, device=DEV) * 3).to(torch.bfloat16)
    if SMOKE:
        smoke_passes(logits)
    else:
        print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
        alone(logits)
    compare_arms(ARMS, BUDGETS, "kernel (default)", L, V, DEV, TIMING_ROUNDS, capture=not SMOKE, name_width=28)


if __name__ == "__main__":
    main()
