"""Issue 10: the walk by pointer jumping (tree_walk.kernel._walk_jumps: log2(N) gathers, the path and emitted tokens
by disjoint stores, no per-sibling dedupe since TreeStep's trees have distinct sibling tokens) against the walk a
reduction a step (`_walk`, 4 warps, up to L steps), and the compile by pointer jumping (tree_mask.kernel._compile_jumps:
the whole tree in one program, each row's ancestors as one integer's bits, up to 64 rows) against the compile's
programs of 4 rows climbing a step at a time, in the whole step (TreeStep's default build, PDL, choices that walk the
tree's first children all the way down), one warp each, by budget; ROUNDS interleaved rounds
(bench_tree_step.interleaved_rounds), same logits as bench_tree_step.py. tail_small_20261206.py measured the first
version (with the dedupe and the path by a [N, N] max) beside two other cuts.

    git apply benchmarks/results/walk_jumps_20261206_compile.diff   # _compile_jumps (not landed); else no compile arms
    PYTHONPATH=engine_patches/ddtree_engine/src python benchmarks/results/walk_jumps_20261206.py [--smoke]

When it ran (walk_jumps_20261206_h100.txt) the walk jumped up to 64 rows whatever its flag said (a cap since folded into
JUMPS_UP_TO_ROWS), so its budget-64 "walk jumps" arm (65 rows) stepped; the arms below set 64.
"""
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, as the earlier scripts here
from bench_tree_step import compare_arms  # noqa: E402  (it puts the engine's src on the path)
from ddtree_engine.kernels.tree_mask import kernel as mask_kernel  # noqa: E402
from ddtree_engine.kernels.tree_walk import kernel as walk_kernel  # noqa: E402

SMOKE = "--smoke" in sys.argv
L, V = (3, 3000) if SMOKE else (15, 151_936)
DEV = "cpu" if SMOKE else "cuda"
ROUNDS = 1 if SMOKE else 9
BUDGETS = (5, 40) if SMOKE else (15, 22, 32, 48, 64)
WALK, COMPILE = (walk_kernel, "JUMPS_UP_TO_ROWS"), (mask_kernel, "JUMPS_UP_TO_ROWS")
ARMS = {
    "as is": {WALK: 0, COMPILE: 0},
    "walk jumps": {WALK: 64, COMPILE: 0},
    "compile jumps": {WALK: 0, COMPILE: 64},
    "both jump": {WALK: 64, COMPILE: 64},
}
if not hasattr(mask_kernel, "_compile_jumps"):  # the diff not applied
    ARMS = {arm: {WALK: flags[WALK]} for arm, flags in ARMS.items() if arm in ("as is", "walk jumps")}


def main():
    compare_arms(ARMS, BUDGETS, "as is", L, V, DEV, ROUNDS, capture=not SMOKE, name_width=20)


main()
