"""Where the threshold build's time goes, stage by stage (H200 only): a copy of tree_build/threshold.py with clock64
stamps at its stage boundaries (candidates of the start bound, its select, the levels, the cut, the layout), each
after a barrier; the build in a CUDA graph for its time, the stamps' median cycles over 30 launches to split it.
Budget 256 with NARROW_LEVEL 32 (landed), 256 (every level in the wide tile), 64, and BOUND_ROUNDS 2; 128 as landed.
Per draw: whether the tree equals the serial build's, the pool at the cut, whether it fell back.

    python benchmarks/results/build_threshold_prof_20261204.py [OUT_DIR]
"""
import json
import sys
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "engine_patches/ddtree_engine/src/ddtree_engine/kernels/tree_build"
src = (PKG / "threshold.py").read_text()
stamp_def = '''
@triton.jit
def _stamp(p):
    tl.debug_barrier()
    x = tl.zeros([1], dtype=tl.int32) + tl.program_id(0)
    c = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [x], dtype=tl.int64, is_pure=False, pack=1)
    tl.store(p + tl.arange(0, 1), c)


@triton.jit
def _build_tree_threshold('''
src = src.replace("\n@triton.jit\ndef _build_tree_threshold(", stamp_def, 1)
src = src.replace("    NPS: tl.constexpr,\n):", "    NPS: tl.constexpr, PROF: tl.constexpr,\n):", 1)
assert "PROF: tl.constexpr" in src
def ins(anchor, text, after=False):
    global src
    assert anchor in src, anchor
    src = src.replace(anchor, anchor + text if after else text + anchor, 1)
ins("    top = B * (L - 1)", "    _stamp(tws_ptr + PROF + 0)\n")
ins("    t = tl.max(tl.full([2], float(\"-inf\"), tl.float64), 0)", "    _stamp(tws_ptr + PROF + 1)\n")
ins("    # Depth 0: the root's children scoring >= t.", "    _stamp(tws_ptr + PROF + 2)\n")
ins("    # The cut at the pool's BUDGET-th best score t_fin", "    _stamp(tws_ptr + PROF + 3)\n    tl.store(tws_ptr + PROF + 8, n_pool.to(tl.int64))\n")
ins("    tl.store(flag_ptr, bad.to(tl.int64))", "    _stamp(tws_ptr + PROF + 4)\n")
ins("\n\ndef fitting_constants", "\n    tl.debug_barrier()\n    _stamp(tws_ptr + PROF + 5)")
(PKG / "threshold_prof.py").write_text(src)
sys.path.insert(0, str(ROOT / "engine_patches/ddtree_engine/src"))
try:
    from ddtree_engine.kernels.tree_build import threshold_prof as tp, kernel as k
finally:
    (PKG / "threshold_prof.py").unlink()
from ddtree_engine.kernels.tree_step import TreeStep
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_tree_step import graphed
device = torch.device("cuda")
L, V = 15, 151936
root = torch.tensor([1], device=device)
prefix = torch.tensor([100], device=device)
names = ["candidates", "bound select", "levels", "cut", "layout"]
out = []
for kind, scale, draws in (("random", 3.0, 3), ("peaked", 3.0, 2), ("mild", 1.0, 2)):
    for draw in range(draws):
        torch.manual_seed(1000 * draw + len(kind))
        logits = torch.randn(L, V, device=device) * scale
        if kind == "peaked":
            logits[:, 7] += 30.0
        logits = logits.to(torch.bfloat16)
        for budget, narrow, rounds in ((256, 32, 3), (256, 256, 3), (256, 64, 3), (256, 32, 2), (128, 32, 3)):
            tp.NARROW_LEVEL, tp.BOUND_ROUNDS = narrow, rounds
            st = TreeStep(L, V, budget, 8, device, build_method="serial")
            st.build(logits, root, prefix)
            consts = dict(k.launch_constants(budget, 8, False), **tp.threshold_constants(budget, 8, L))
            ws, wss = k.workspaces(budget, False, device)
            tsize = 2 * consts["CAPT"] + triton.next_power_of_2(budget) + consts["TC"] + 1
            prof = tsize + 16
            tws = torch.zeros(prof + 16, dtype=torch.int64, device=device)
            twss = torch.empty(prof + 16, dtype=torch.float64, device=device)
            outs = tuple(torch.empty_like(x) for x in st.tree)
            run = lambda: tp._build_tree_threshold[(1,)](st.vals, st.ids, root, L, 0, ws, wss, tws, twss, *outs, tws[tsize:tsize + 1], **consts, PROF=prof, num_warps=k.THRESHOLD_WARPS)
            run()
            torch.cuda.synchronize()
            same = all(torch.equal(a, b) for a, b in zip(outs, st.tree))
            stamps = []
            for _ in range(30):
                run()
                torch.cuda.synchronize()
                stamps.append(tws[prof:prof + 11].cpu().tolist())
            us = do_bench(graphed(run).replay, warmup=25, rep=200, return_mode="median") * 1e3
            med = lambda xs: sorted(xs)[len(xs) // 2]
            cyc = [med([s[i + 1] - s[i] for s in stamps]) for i in range(5)]
            tot = sum(cyc)
            row = dict(kind=kind, draw=draw, budget=budget, narrow=narrow, rounds=rounds, build_us=us, same=same, n_pool=stamps[-1][8], fell_back=int(tws[tsize]),
                       stages_us={n: us * c / tot for n, c in zip(names, cyc)}, cycles=cyc)
            out.append(row)
            print(f"{kind:>6} d{draw} b{budget} nar {narrow:>3} br {rounds} build {us:6.1f} us same {same} pool {row['n_pool']} fb {row['fell_back']} | " + " ".join(f"{n} {v:5.1f}" for n, v in row["stages_us"].items()), flush=True)
if len(sys.argv) > 1:
    Path(sys.argv[1], "build_threshold_prof_20261204.json").write_text(json.dumps(out, indent=1))
