"""Issue 10: the top-K's merge picking the K best blocks and then the row's K best keys by counting ranks (a [C, C]
compare of the keys loaded twice, as a column and as a row: topk_logprobs.kernel.MERGE_BY_RANKS, `_merge_by_ranks`)
against the same two picks by `tl.topk` (`_top_keys`; MERGE_BY_RANKS off), in the whole step (TreeStep's default build, PDL, the target choosing each node's first
child), by budget; ROUNDS interleaved rounds (bench_tree_step.interleaved_rounds), same logits as bench_tree_step.py
(V = 151,936: 38 blocks of 4,096 a row, 64 x 8 = 512 keys with the padding).

    git apply benchmarks/results/merge_ranks_20261207.diff   # MERGE_BY_RANKS, `_merge_by_ranks` (not landed)
    PYTHONPATH=engine_patches/ddtree_engine/src python benchmarks/results/merge_ranks_20261207.py [--smoke]

Run (merge_ranks_20261207_h100.txt): the ranks 1.6-2.0 us slower a step at budgets 15, 22 and 64, the same arrays. An
earlier variant in these arms (merge_all_20261207_h100.txt: one tl.topk over all 512 keys) was 1.7-2.1 us slower.
"""
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, as the earlier scripts here
from bench_tree_step import compare_arms  # noqa: E402  (it puts the engine's src on the path)
from ddtree_engine.kernels.topk_logprobs import kernel as topk_kernel  # noqa: E402

SMOKE = "--smoke" in sys.argv
L, V = (3, 3000) if SMOKE else (15, 151_936)
DEV = "cpu" if SMOKE else "cuda"
ROUNDS = 1 if SMOKE else 7
BUDGETS = (5, 40) if SMOKE else (15, 22, 64)
FLAG = (topk_kernel, "MERGE_BY_RANKS")
BLOCK = {"topk_block": 64} if SMOKE else {}  # small blocks so the smoke's rows take more than KP of them
ARMS = {"selections": ({FLAG: False}, BLOCK), "ranks": ({FLAG: True}, BLOCK)}


def main():
    compare_arms(ARMS, BUDGETS, "selections", L, V, DEV, ROUNDS, capture=not SMOKE, name_width=20)


main()
