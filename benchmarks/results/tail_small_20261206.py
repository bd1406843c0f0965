"""Issue 10: three small cuts at the budget-15 step's tail, each alone and together, against the step as it is: the
walk by pointer jumping (tree_walk.kernel.JUMPS_UP_TO_ROWS: one warp, log2(N) gathers instead of up to L block-wide
reductions), the first pass's group sums in fp32 before the fp64 sum over groups (topk_logprobs.kernel.SUM32), and the
merge taking the K best of all its row's keys in one load (MERGE_ALL_KEYS_UP_TO) instead of the K best blocks' first.
The step with the walk (TreeStep's default build, PDL), choices that walk the tree's first children all the way down,
ROUNDS interleaved rounds (bench_tree_step.interleaved_rounds), same logits as bench_tree_step.py.

    git apply benchmarks/results/tail_small_20261206.diff   # SUM32 and MERGE_ALL_KEYS_UP_TO (not landed)
    PYTHONPATH=engine_patches/ddtree_engine/src python benchmarks/results/tail_small_20261206.py [--smoke]

Its walk arm ran the walk by jumps' first version (per-sibling dedupe, the path by an [N, N] max; the landed kernel
stores the path instead and skips the dedupe for TreeStep's trees).
"""
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, as the earlier scripts here
from bench_tree_step import compare_arms  # noqa: E402  (it puts the engine's src on the path)
from ddtree_engine.kernels.topk_logprobs import kernel as topk_kernel  # noqa: E402
from ddtree_engine.kernels.tree_walk import kernel as walk_kernel  # noqa: E402

SMOKE = "--smoke" in sys.argv
L, V = (3, 3000) if SMOKE else (15, 151_936)
DEV = "cpu" if SMOKE else "cuda"
ROUNDS = 1 if SMOKE else 9
BUDGETS = (5,) if SMOKE else (15, 22, 64)
ARMS = {
    "as is": {},
    "walk by jumps": {(walk_kernel, "JUMPS_UP_TO_ROWS"): 1 << 20},
    "fp32 group sums": {(topk_kernel, "SUM32"): True},
    "merge all keys": {(topk_kernel, "MERGE_ALL_KEYS_UP_TO"): 1 << 20},
}
ARMS["all three"] = {k: v for arm in list(ARMS.values()) for k, v in arm.items()}


def main():
    compare_arms(ARMS, BUDGETS, "as is", L, V, DEV, ROUNDS, capture=not SMOKE, name_width=26)


main()
