"""Issue 10: the serial build's layout by pointer jumping in registers (tree_build.kernel.LAYOUT_JUMPS_UP_TO,
`_layout`'s LJ: each chosen node's rank path in log2(NB) gather rounds, places by the count over the keys read back
once, parents' places by a gather) against its climb through the workspace (L - 1 steps of two dependent loads, two
store-barrier-load round trips), and, with compile_in_build_20261206.diff applied, the build that then compiles the
tree from those keys (COMPILE_IN_BUILD_UP_TO_ROWS, `_build_compile_tree`: the step's compile launch and its parent
climbs gone), in the whole step (TreeStep's default build, the walk by jumps, PDL, choices that walk the tree's first
children all the way down), by budget, on a flat draw and a deep one; ROUNDS interleaved rounds
(bench_tree_step.interleaved_rounds), same logits as bench_tree_step.py.

    [git checkout 88ae34e && git apply benchmarks/results/compile_in_build_20261206.diff]   # the third arm (not landed;
    # the diff is against 88ae34e, before the two layouts became one helper)
    PYTHONPATH=engine_patches/ddtree_engine/src python benchmarks/results/layout_compile_20261206.py [--smoke]

H100 2026-12-06 (layout_compile_20261206_h100.txt): the layout by jumps -0.29 / -1.15 us at budget 15 (flat / deep),
-0.20 / -1.73 at 22, -0.54 / +0.19 at 32, -0.13 / +0.07 at 48: landed up to NB 32. The compile in the build: at 15
-0.73 / +0.51 against the jumps alone, +3.0 / +4.4 at 22 (one warp walks [32, 32] int64 tiles): not landed.
layout_compile_20261206_first_h100.txt: a first version whose register compares cost more than they saved.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, as the earlier scripts here
from bench_tree_step import arm_steps, draws, interleaved_rounds  # noqa: E402
from ddtree_engine.kernels.tree_build import kernel as build_kernel  # noqa: E402

SMOKE = "--smoke" in sys.argv
L, V = (3, 3000) if SMOKE else (15, 151_936)
DEV = "cpu" if SMOKE else "cuda"
ROUNDS = 1 if SMOKE else 7
BUDGETS = (5, 40) if SMOKE else (15, 22, 32, 48)
LAYOUT, COMPILE = (build_kernel, "LAYOUT_JUMPS_UP_TO"), (build_kernel, "COMPILE_IN_BUILD_UP_TO_ROWS")
if hasattr(build_kernel, COMPILE[1]):  # compile_in_build_20261206.diff applied
    ARMS = {"climb": {LAYOUT: 0, COMPILE: 0}, "layout jumps": {LAYOUT: 64, COMPILE: 0},
            "jumps, compile in build": {LAYOUT: 64, COMPILE: 32}}
else:
    ARMS = {"climb": {LAYOUT: 0}, "layout jumps": {LAYOUT: 64}}


def main():
    both, root, prefix = draws(L, V, DEV)
    logits = both[0][1]
    graphs, keep = {}, []
    for draw, x in ((name if name == "flat" else "peaked", x) for name, x in both):
        for budget in BUDGETS:
            steps, step_graphs = arm_steps(x, root, prefix, budget, ARMS, keep, capture=not SMOKE)
            graphs.update({f"{draw} b{budget} {arm}": graph for arm, graph in step_graphs.items()})
            base = steps["climb"]
            for arm, step in steps.items():
                same = all(torch.equal(a, b) for a, b in zip(base.tree + base.compiled + base.walked,
                                                             step.tree + step.compiled + step.walked))
                depth = int(step.tree[2].max())
                print(f"{draw} b{budget} {arm}: arrays {'same' if same else 'MISMATCH'}, depth {depth}, "
                      f"commit length {int(step.walked[2][0])}, compiled in the build {getattr(step, 'compile_in_build', False)}",
                      flush=True)
    if SMOKE:
        return
    interleaved_rounds(graphs, logits, ROUNDS, name_width=34, us_width=7)


main()
