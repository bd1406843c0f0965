"""Issue 10: climbing parent links by gather instead of a load a step, in the tree compile (compile_tree_arrays'
gather: the parent array read once, each step a tl.gather) and in the serial build's layout (`_build_tree`'s GATHER:
the chosen nodes' ranks and parents read once), by budget, the step in CUDA graphs, interleaved rounds.

tail_launch_20261206_h100.txt found the compile's gather 0.35 us slower alone at budget 15 (16 rows) and 1.2 us
faster at 64. Here, at budgets 15, 22, 32, 64, 128 and 256 (TreeStep's default build: serial, threshold from 128;
PDL): the step with the walk with both climbs by loads, the compile's by gather, the layout's by gather (budgets up
to 32, the one-warp builds) and both, and the compile alone both ways; tree_mask.kernel.GATHER_FROM_ROWS (GATHER_UP_TO_ROWS unbounded) and
tree_build.kernel.LAYOUT_GATHER_UP_TO set around each capture (the graph keeps the kernels it launched). ROUNDS
interleaved rounds (median of the rounds' do_bench medians: bench_tree_step.interleaved_rounds), same logits as bench_tree_step.py ([15, 151,936] bf16,
randn * 3, seed 0); every arm's arrays checked against the loads'.

    git apply benchmarks/results/gathers_20261206_layout.diff   # the layout's gather (LAYOUT_GATHER_UP_TO) and its tests
    PYTHONPATH=engine_patches/ddtree_engine/src python benchmarks/results/gathers_20261206.py [--smoke]

The layout's gather was not landed: slower at every budget it took (gathers_20261206_h100.txt).
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, as the earlier scripts here
from bench_tree_step import graphed, interleaved_rounds  # noqa: E402  (it puts the engine's src on the path)
from ddtree_engine.kernels.tree_build import kernel as build_kernel  # noqa: E402
from ddtree_engine.kernels.tree_mask import kernel as mask_kernel  # noqa: E402
from ddtree_engine.kernels.tree_step import TreeStep  # noqa: E402

SMOKE = "--smoke" in sys.argv
L, V = (3, 3000) if SMOKE else (15, 151_936)
DEV = "cpu" if SMOKE else "cuda"
ROUNDS = 1 if SMOKE else 7
BUDGETS = (5, 40) if SMOKE else (15, 22, 32, 64, 128, 256)
NEVER = 10**9
# arm: (GATHER_FROM_ROWS, LAYOUT_GATHER_UP_TO)
ARMS = {"loads": (NEVER, 0), "compile gather": (1, 0), "layout gather": (NEVER, NEVER), "both gathers": (1, NEVER)}


def settings(rows, upto):
    """Set the two module constants; returns the old values."""
    old = mask_kernel.GATHER_FROM_ROWS, build_kernel.LAYOUT_GATHER_UP_TO
    mask_kernel.GATHER_FROM_ROWS, build_kernel.LAYOUT_GATHER_UP_TO = rows, upto
    mask_kernel.GATHER_UP_TO_ROWS = NEVER  # no upper bound when this ran (it came from this run and the next)
    return old


def main():
    torch.manual_seed(0)
    logits = (torch.randn(L, V, device=DEV) * 3).to(torch.bfloat16)
    root, prefix = torch.tensor([1], device=DEV), torch.tensor([100], device=DEV)
    graphs, keep = {}, []
    for budget in BUDGETS:
        steps = {}
        for arm, (rows, upto) in ARMS.items():
            step = TreeStep(L, V, budget, 8, DEV, pdl=not SMOKE)
            keep.append(step)
            choices = torch.zeros(step.num_rows, dtype=torch.long, device=DEV)

            def whole(s=step, c=choices, rows=rows, upto=upto):
                old = settings(rows, upto)
                try:
                    s.build(logits, root, prefix)
                    s.walk(c)
                finally:
                    settings(*old)

            whole()
            steps[arm] = step
            if not SMOKE:
                graphs[f"b{budget} step, {arm}"] = graphed(whole)
            if arm in ("loads", "compile gather"):

                def alone(s=step, gather=arm != "loads"):
                    tok, par, dep, _, _, n = s.tree
                    s.mask_kernel.compile_tree_arrays(par, dep, n, prefix, L, out=s.compiled, gather=gather)

                if not SMOKE:
                    graphs[f"b{budget} compile alone, {arm}"] = graphed(alone)
        a = steps["loads"]
        for arm, b in steps.items():
            same = all(torch.equal(x, y) for x, y in zip(a.tree + a.compiled + a.walked, b.tree + b.compiled + b.walked))
            print(f"b{budget} ({a.build_method} build, {a.num_rows} rows) {arm}: arrays {'same' if same else 'MISMATCH'}",
                  flush=True)
    if SMOKE:
        return
    interleaved_rounds(graphs, logits, ROUNDS, name_width=36, us_width=7)


main()
