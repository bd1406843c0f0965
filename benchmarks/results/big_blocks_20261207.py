"""Issue 10: the top-K's first pass on blocks large enough that a row has no more of them
than K (8): 32,768 tokens a block at V = 151,936 is 5 blocks a row, 75 programs for 15 rows (an H100 or H200 has 132
SMs: at most one a SM), and the merge then takes a row's K best of all its 5 x 8 keys in one load and one selection
(`_merge_row`'s CP <= KP path) instead of picking the K best blocks by their first keys and loading their keys in a
second, dependent load. Against the default blocking (4,096 tokens, groups of 8, 4 warps: 38 blocks a row), the step
as TreeStep runs it (first pass, merge, build with compile, walk: four launches, PDL), by budget. 16,384-token blocks
(10 a row, still two loads in the merge) beside it.

Timed on an H100 (2026-12-07 ~15:45 UTC, big_blocks_20261207_h100.txt): every large blocking slower at every budget
(15: 20.54 us by default, 25.34-26.59 at 16,384 tokens, 26.91-32.16 at 32,768); the pass's fewer, longer programs
cost more than the merge's second load saves.

Each arm is TreeStep's own keywords (topk_block, topk_group, topk_warps); every arm's arrays are checked against the
default's first (`--smoke`: under TRITON_INTERPRET=1 at V 3,000 with the blocks capped at 512, so the smoke rows
have 6 blocks and take the one-load merge, as the real size does with 32,768).

    PYTHONPATH=engine_patches/ddtree_engine/src python benchmarks/results/big_blocks_20261207.py [--smoke]
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, as the earlier scripts here
from bench_tree_step import compare_arms  # noqa: E402  (it puts the engine's src on the path)

SMOKE = "--smoke" in sys.argv
L, V = (3, 3000) if SMOKE else (15, 151_936)
DEV = "cpu" if SMOKE else "cuda"
TIMING_ROUNDS = 1 if SMOKE else 7
BUDGETS = (5, 22) if SMOKE else (15, 22, 32)


def arm(block: int, group: int, warps: int) -> tuple[dict, dict]:
    block = min(block, 512) if SMOKE else block
    return {}, {"topk_block": block, "topk_group": group, "topk_warps": warps}


ARMS = {"4096/8/4w (default)": ({}, {}),
        "16384/32/8w": arm(16384, 32, 8),
        "16384/32/16w": arm(16384, 32, 16),
        "32768/64/8w": arm(32768, 64, 8),
        "32768/64/16w": arm(32768, 64, 16),
        "32768/32/16w": arm(32768, 32, 16),
        "32768/64/32w": arm(32768, 64, 32)}


def main():
    torch.manual_seed(0)
    compare_arms(ARMS, BUDGETS, "4096/8/4w (default)", L, V, DEV, TIMING_ROUNDS, capture=not SMOKE, name_width=28)


if __name__ == "__main__":
    main()
