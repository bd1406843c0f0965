"""Issue 10, budget 15 <= 1.2x the argmax: the one-launch build (TreeStep(fused=True)) with one-warp programs.

The one-launch build ran its programs with the top-K pass's 4 warps, so its last program built the tree with 4 warps
(the build kernel takes 1 below budget 128) and it was slower than the four launches (25.7 against 24.4 us, H100,
bench_tree_step_20261206_035638_h100). The first pass is fastest on 1,024-token blocks, one warp, selections by K
rounds (firstpass_anatomy_20261205_h100.txt mode 7: 4.64 us a launch against 6.53). Here the fused build with
those programs, against the four launches, all with PDL, the walk after each, in CUDA graphs, same logits
(bench_tree_step.py's: [15, 151,936] bf16, randn * 3, seed 0), each checked against the default step's arrays.

    PYTHONPATH=engine_patches/ddtree_engine/src python benchmarks/results/fused_warps_20261206.py [--smoke]
"""
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, as the earlier scripts here
from bench_tree_step import graphed  # noqa: E402  (it puts the engine's src on the path)
from ddtree_engine.kernels.tree_step import TreeStep  # noqa: E402

SMOKE = "--smoke" in sys.argv
L, V = (3, 3000) if SMOKE else (15, 151_936)
DEV = "cpu" if SMOKE else "cuda"


def main():
    torch.manual_seed(0)
    logits = (torch.randn(L, V, device=DEV) * 3).to(torch.bfloat16)
    root, prefix = torch.tensor([1], device=DEV), torch.tensor([100], device=DEV)
    bench = lambda fn: do_bench(fn, warmup=25, rep=300, return_mode="median") * 1e3  # noqa: E731
    if not SMOKE:
        print(f"# {torch.cuda.get_device_name()}")
        out = logits.argmax(-1)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            torch.argmax(logits, dim=-1, out=out)
        argmax = bench(g.replay)
        print(f"argmax in a graph {argmax:.2f} us")
    budgets = [15] if not SMOKE else [5]
    configs = [("default (PDL)", {})]
    for fused in (False, True):
        for block, warps, rounds in ((4096, 4, False), (1024, 1, True), (1024, 1, False), (2048, 1, True),
                                     (2048, 2, True), (2048, 2, False), (1024, 2, True)):
            if SMOKE:
                block = min(block, 1024)
            configs.append((f"{'fused' if fused else 'four'} {block}/8/{warps}w{' rounds' if rounds else ''}",
                            dict(fused=fused, build_method="serial", topk_block=block, topk_warps=warps,
                                 topk_rounds=rounds, pdl=not SMOKE)))
    for budget in budgets:
        ref = None
        for name, kw in configs:
            step = TreeStep(L, V, budget, 8, DEV, **kw)
            choices = torch.zeros(step.num_rows, dtype=torch.long, device=DEV)

            def run(step=step, choices=choices):
                step.build(logits, root, prefix)
                step.walk(choices)

            run()
            run()  # the fused build must find its counters at zero again
            arrays = [t.clone() for t in step.tree + step.compiled + step.walked]
            if ref is None:
                ref = arrays
            # Same tree, compiled arrays and walk; the scores (tree[4], fp64 sums of log-probs whose logsumexp the
            # blocking groups differently) within 1e-6.
            same = all(torch.equal(a, b) for i, (a, b) in enumerate(zip(arrays, ref)) if i != 4)
            same = same and (arrays[4] - ref[4]).abs().max().item() < 1e-6
            if SMOKE:
                print(budget, name, "same" if same else "MISMATCH")
                continue
            us = bench(graphed(run).replay)
            print(f"b{budget} {name:28s} {us:6.2f} us  {us / argmax:.3f}x the graphed argmax"
                  + ("" if same else "  MISMATCH"), flush=True)


main()
