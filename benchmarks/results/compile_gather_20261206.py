"""Issue 10: the tree compile by gather (compile_tree_arrays(gather=True)) against a load a step, a second run at the
budgets where gathers_20261206_h100.txt left it open (48 to 256), more rounds: the step with the walk (TreeStep's
default build, PDL) and the compile alone, both ways (tree_mask.kernel.GATHER_FROM_ROWS set around each capture, GATHER_UP_TO_ROWS unbounded),
ROUNDS interleaved rounds (median of the rounds' do_bench medians: bench_tree_step.interleaved_rounds), same logits as bench_tree_step.py.

    PYTHONPATH=engine_patches/ddtree_engine/src python benchmarks/results/compile_gather_20261206.py [--smoke]
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, as the earlier scripts here
from bench_tree_step import graphed, interleaved_rounds  # noqa: E402  (it puts the engine's src on the path)
from ddtree_engine.kernels.tree_mask import kernel as mask_kernel  # noqa: E402
from ddtree_engine.kernels.tree_step import TreeStep  # noqa: E402

SMOKE = "--smoke" in sys.argv
L, V = (3, 3000) if SMOKE else (15, 151_936)
DEV = "cpu" if SMOKE else "cuda"
ROUNDS = 1 if SMOKE else 9
BUDGETS = (5, 40) if SMOKE else (48, 64, 96, 128, 192, 256)
ARMS = {"loads": 10**9, "gather": 1}  # GATHER_FROM_ROWS


def main():
    torch.manual_seed(0)
    logits = (torch.randn(L, V, device=DEV) * 3).to(torch.bfloat16)
    root, prefix = torch.tensor([1], device=DEV), torch.tensor([100], device=DEV)
    graphs, keep = {}, []
    for budget in BUDGETS:
        steps = {}
        for arm, rows in ARMS.items():
            step = TreeStep(L, V, budget, 8, DEV, pdl=not SMOKE)
            keep.append(step)
            choices = torch.zeros(step.num_rows, dtype=torch.long, device=DEV)

            def whole(s=step, c=choices, rows=rows):
                old, mask_kernel.GATHER_FROM_ROWS = mask_kernel.GATHER_FROM_ROWS, rows
                mask_kernel.GATHER_UP_TO_ROWS = 10**9  # no upper bound when this ran (it came from this run)
                try:
                    s.build(logits, root, prefix)
                    s.walk(c)
                finally:
                    mask_kernel.GATHER_FROM_ROWS = old

            def alone(s=step, gather=arm == "gather"):
                tok, par, dep, _, _, n = s.tree
                s.mask_kernel.compile_tree_arrays(par, dep, n, prefix, L, out=s.compiled, gather=gather)

            whole()
            steps[arm] = step
            if not SMOKE:
                graphs[f"b{budget} step, compile by {arm}"] = graphed(whole)
                graphs[f"b{budget} compile alone, by {arm}"] = graphed(alone)
        a, b = steps["loads"], steps["gather"]
        same = all(torch.equal(x, y) for x, y in zip(a.tree + a.compiled + a.walked, b.tree + b.compiled + b.walked))
        print(f"b{budget} ({a.build_method} build, {a.num_rows} rows): gather's arrays {'same' if same else 'MISMATCH'}", flush=True)
    if SMOKE:
        return
    interleaved_rounds(graphs, logits, ROUNDS, name_width=36, us_width=7)


main()
