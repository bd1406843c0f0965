"""Issue 10: where the top-K's merge runs, and the whole build in one launch on one warp.

Arms (TreeStep at the default build, PDL, choices that walk the first children down; TreeStep keywords: merge_in and the
first pass's): "default", four launches (first pass, merge, build that compiles, walk); "merge in pass", the program that
finishes a row of the first pass last merges it (topk_logprobs.kernel._chunk_merge_topk: three launches); "merge in
build", L one-warp programs each merge a row and the last builds and compiles (tree_step.kernel.MergeBuild: three);
"fused 1w ..." the one-launch build (TreeStep(fused=True)) on one warp, its first pass by K rounds or `tl.topk` on
1,024-token blocks, its build compiling from registers as the build's own launch does (two launches). By budget, on a
flat draw and a deep one; ROUNDS interleaved rounds (bench_tree_step.interleaved_rounds).

    git apply benchmarks/results/merge_fold_20261207.diff   (TreeStep(merge_in=...); not on main: slower)
    PYTHONPATH=engine_patches/ddtree_engine/src python benchmarks/results/merge_fold_20261207.py [--smoke]

merge_fold_20261207_h100.txt: its run on an H100 (no H200 came), every arm slower than the default at every budget.
"""
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, as the earlier scripts here
from bench_tree_step import arm_steps, draws, interleaved_rounds, report_arms  # noqa: E402

SMOKE = "--smoke" in sys.argv
L, V = (3, 3000) if SMOKE else (15, 151_936)
DEV = "cpu" if SMOKE else "cuda"
ROUNDS = 1 if SMOKE else 7
SHAPES = ((5, 8), (12, 4)) if SMOKE else ((15, 8), (22, 8), (32, 8))  # (budget, topk)
ARMS = {
    "default": ({}, dict(merge_in="launch")),
    "merge in pass": ({}, dict(merge_in="pass")),
    "merge in build": ({}, dict(merge_in="build")),
    "merge in pass, 1w rounds 1024": ({}, dict(merge_in="pass", topk_warps=1, topk_rounds=True, topk_block=1024)),
    "merge in build, 1w rounds 1024": ({}, dict(merge_in="build", topk_warps=1, topk_rounds=True, topk_block=1024)),
    "fused 1w rounds 1024": ({}, dict(fused=True, topk_warps=1, topk_rounds=True, topk_block=1024)),
    "fused 1w topk 1024": ({}, dict(fused=True, topk_warps=1, topk_block=1024)),
}


def main():
    both, root, prefix = draws(L, V, DEV)
    logits = both[0][1]
    graphs, keep = {}, []
    for draw, x in both:
        for budget, topk in SHAPES:
            steps, step_graphs = arm_steps(x, root, prefix, budget, ARMS, keep, capture=not SMOKE, topk=topk)
            label = f"{draw} b{budget}/{topk}"
            graphs.update({f"{label} {arm}": graph for arm, graph in step_graphs.items()})
            report_arms(label, steps, "default")
    if not SMOKE:
        interleaved_rounds(graphs, logits, ROUNDS, name_width=46, us_width=7)


main()
