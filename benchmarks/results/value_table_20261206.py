"""Issue 10: how the serial build's pops read the per-depth values and where it keeps the nodes it chose.

Arms (tree_build.kernel flags): "loads", a load a value (two a pop, each waiting on the pop before: an L2 round trip
where the line is new, as on a deep draw), the chosen nodes stored to the workspace and read back for the layout (main
before this); "table", the [L, K] values read once into registers and each pop's taken by a `tl.gather` (one round of
warp shuffles; VALUE_TABLE_UP_TO, `_select`'s TP); "table, chosen in registers", also the chosen nodes' parent, depth,
rank and score kept in [NB] vectors (CHOSEN_IN_REGISTERS, `_select`'s RC: no store, barrier and load before the layout,
the tokens' loads issued before it); "all three, compile in build", also the tree's compile in the build's launch
from those registers (COMPILE_IN_BUILD, `_build_compile_tree`: ancestors as bits by pointer jumping, links from the
frontier slots; the step's compile launch gone). In the whole step (TreeStep's default build, PDL, choices that walk the first
children down), by budget and topk, on a flat draw and a deep one. Beside them, what a chain of n trivial kernels (one
program, one warp: wait, load, store) costs in a CUDA graph with PDL and without: the step's floor per launch. ROUNDS
interleaved rounds (bench_tree_step.interleaved_rounds), same logits as bench_tree_step.py.

    PYTHONPATH=engine_patches/ddtree_engine/src python benchmarks/results/value_table_20261206.py [--smoke]

value_table_20261206_modes_h200.txt: the first run, whose flag had two more ways to read the values (a select and max
over the table in registers; the table read once into L1, then the loads), both slower than the gather.
"""
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, as the earlier scripts here
from bench_tree_step import arm_steps, draws, graphed, interleaved_rounds  # noqa: E402
from ddtree_engine.kernels.gdc import gdc_enter, launch_options  # noqa: E402
from ddtree_engine.kernels.tree_build import kernel as build_kernel  # noqa: E402

SMOKE = "--smoke" in sys.argv
L, V = (3, 3000) if SMOKE else (15, 151_936)
DEV = "cpu" if SMOKE else "cuda"
ROUNDS = 1 if SMOKE else 7
SHAPES = ((5, 8), (40, 4)) if SMOKE else ((15, 8), (22, 8), (32, 8))  # (budget, topk)
TABLE, REGS = (build_kernel, "VALUE_TABLE_UP_TO"), (build_kernel, "CHOSEN_IN_REGISTERS")
COMPILE = (build_kernel, "COMPILE_IN_BUILD")
ARMS = {"loads": {TABLE: 0, REGS: False, COMPILE: False}, "table": {TABLE: 256, REGS: False, COMPILE: False},
        "table, chosen in registers": {TABLE: 256, REGS: True, COMPILE: False},
        "all three, compile in build": {TABLE: 256, REGS: True, COMPILE: True}}


@triton.jit
def _link(src_ptr, dst_ptr, GDC: tl.constexpr = False):
    gdc_enter(GDC)
    tl.store(dst_ptr, tl.load(src_ptr) + 1)


def chain(n: int, pdl: bool, keep: list):
    """A CUDA graph of n trivial kernels, each reading what the one before wrote."""
    bufs = torch.zeros(n + 1, device=DEV)
    keep.append(bufs)
    opts = launch_options(bufs, pdl)

    def run():
        for i in range(n):
            _link[(1,)](bufs[i:], bufs[i + 1:], num_warps=1, **opts)

    return graphed(run)


def main():
    both, root, prefix = draws(L, V, DEV)
    logits = both[0][1]
    graphs, keep = {}, []
    for draw, x in both:
        for budget, topk in SHAPES:
            steps, step_graphs = arm_steps(x, root, prefix, budget, ARMS, keep, capture=not SMOKE, topk=topk)
            label = f"{draw} b{budget}/{topk}"
            graphs.update({f"{label} {arm}": graph for arm, graph in step_graphs.items()})
            base = steps["loads"]
            for arm, step in steps.items():
                same = all(torch.equal(a, b) for a, b in zip(base.tree + base.compiled + base.walked,
                                                             step.tree + step.compiled + step.walked))
                print(f"{label} {arm}: arrays {'same' if same else 'MISMATCH'}, depth {int(step.tree[2].max())}, "
                      f"commit length {int(step.walked[2][0])}", flush=True)
    if SMOKE:
        return
    for pdl in (True, False):
        for n in (1, 2, 3, 5, 8):
            graphs[f"chain of {n} {'PDL' if pdl else 'plain'}"] = chain(n, pdl, keep)
    interleaved_rounds(graphs, logits, ROUNDS, name_width=40, us_width=7)


main()
