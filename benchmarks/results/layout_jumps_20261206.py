"""Issue 10: the serial build's layout by pointer jumping in registers (tree_build.kernel.LAYOUT_JUMPS_UP_TO, `_build_tree`'s
LJ: each chosen node's rank path in log2(NB) gather rounds, places by an [NB, NB] count, parents' places by a gather)
against its climb through the workspace (L - 1 steps of two loads, two store-barrier-load round trips), in the whole
step (TreeStep's default build, the walk by jumps, PDL, choices that walk the tree's first children all the way down),
by budget; ROUNDS interleaved rounds (bench_tree_step.interleaved_rounds), same logits as bench_tree_step.py.

    git apply benchmarks/results/layout_jumps_20261206.diff   # the layout by jumps, its tests (not landed)
    PYTHONPATH=engine_patches/ddtree_engine/src python benchmarks/results/layout_jumps_20261206.py [--smoke]

Not yet run on a GPU (2026-12-06: the session's device time ran out after two refused starts). The diff sets
LAYOUT_JUMPS_UP_TO = 64 as its default; under TRITON_INTERPRET=1 with it test_tree_build.py and test_tree_step.py pass
(574 passed), its new test (both ways on every shape) too, and dropping the jump rounds past the second turns it red.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, as the earlier scripts here
from bench_tree_step import arm_steps, interleaved_rounds  # noqa: E402
from ddtree_engine.kernels.tree_build import kernel as build_kernel  # noqa: E402

SMOKE = "--smoke" in sys.argv
L, V = (3, 3000) if SMOKE else (15, 151_936)
DEV = "cpu" if SMOKE else "cuda"
ROUNDS = 1 if SMOKE else 7
BUDGETS = (5, 40) if SMOKE else (15, 22, 32, 48)
LAYOUT = (build_kernel, "LAYOUT_JUMPS_UP_TO")
ARMS = {"climb": {LAYOUT: 0}, "layout jumps": {LAYOUT: 64}}


def main():
    torch.manual_seed(0)
    logits = (torch.randn(L, V, device=DEV) * 3).to(torch.bfloat16)
    peaked = logits.clone()
    peaked[:, 7] += 25  # one strong candidate a depth (as a confident drafter's): a deep tree
    root, prefix = torch.tensor([1], device=DEV), torch.tensor([100], device=DEV)
    graphs, keep = {}, []
    for draw, x in (("flat", logits), ("peaked", peaked)):
        for budget in BUDGETS:
            steps, step_graphs = arm_steps(x, root, prefix, budget, ARMS, keep, capture=not SMOKE)
            graphs.update({f"{draw} b{budget} {arm}": graph for arm, graph in step_graphs.items()})
            base = steps["climb"]
            for arm, step in steps.items():
                same = all(torch.equal(a, b) for a, b in zip(base.tree + base.compiled + base.walked,
                                                             step.tree + step.compiled + step.walked))
                depth = int(step.tree[2].max())
                print(f"{draw} b{budget} {arm}: arrays {'same' if same else 'MISMATCH'}, depth {depth}, "
                      f"commit length {int(step.walked[2][0])}", flush=True)
    if SMOKE:
        return
    interleaved_rounds(graphs, logits, ROUNDS, name_width=28, us_width=7)


main()
