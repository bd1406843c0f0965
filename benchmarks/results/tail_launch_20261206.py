"""Issue 10, budget 15: the step in two launches (TreeStep(tail=True): the top-K's first pass, then its merge whose
last program builds and compiles) against the default's four, and the compile climbing parents by gather, all in
CUDA graphs timed in interleaved rounds.

The default step is five dependent launches (first pass, merge, build, compile, walk), each ~1.8-2.3 us alone in a
graph (tail_warps_20261206_h100.txt). Here: the default step (PDL), the same with the compile by gather
(compile_tree_arrays(gather=True)), the two-launch build with PDL and plain, the one-launch build (fused, PDL), the
first pass + walk alone (the floor of any build on this pass), the compile alone both ways at 4 warps / 4 rows and
1 warp / 16 rows (what the tail's last program runs), at budgets 15, 22 and 64; graphs measured in ROUNDS interleaved
rounds (median of the rounds' do_bench medians: bench_tree_step.interleaved_rounds), same logits as bench_tree_step.py ([15, 151,936] bf16, randn * 3,
seed 0). Every variant's arrays are checked against the default step's.

    git apply benchmarks/results/tail_launch_20261206.diff   # TailBuild, TreeStep(tail=True) and its tests
    PYTHONPATH=engine_patches/ddtree_engine/src python benchmarks/results/tail_launch_20261206.py [--smoke]

Not landed: the two-launch build was slower at every budget timed (tail_launch_20261206_h100.txt). Run on a later main,
the default arm at budget 64 compiles by gather (tree_mask.kernel.climbs_by_gather, landed after this ran), so its
"compile by gather" arm no longer differs from it there.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, as the earlier scripts here
from bench_tree_step import graphed, interleaved_rounds  # noqa: E402  (it puts the engine's src on the path)
from ddtree_engine.kernels.tree_step import TreeStep  # noqa: E402
from ddtree_engine.kernels.tree_step.kernel import TailBuild  # noqa: E402

SMOKE = "--smoke" in sys.argv
L, V = (3, 3000) if SMOKE else (15, 151_936)
DEV = "cpu" if SMOKE else "cuda"
ROUNDS = 1 if SMOKE else 7
BUDGETS = (5,) if SMOKE else (15, 22, 64)


def chain_choices(step):
    """The target's choice at a node = its first child's token (the walk follows the top-1 chain)."""
    tokens, parents = step.tree[0], step.tree[1]
    choices = torch.full((step.num_rows,), 7, dtype=torch.long, device=DEV)
    for i in reversed(range(1, int(step.tree[5][0]))):
        choices[int(parents[i])] = tokens[i]
    return choices


def variants(budget, logits, root, prefix):
    pdl = not SMOKE
    step = TreeStep(L, V, budget, 8, DEV, pdl=pdl)
    step.build(logits, root, prefix)
    choices = chain_choices(step)
    tail = TreeStep(L, V, budget, 8, DEV, pdl=pdl, tail=True)
    tail_plain = TreeStep(L, V, budget, 8, DEV, pdl=False, tail=True)
    fused = TreeStep(L, V, budget, 8, DEV, pdl=pdl, fused=True)
    three = TreeStep(L, V, budget, 8, DEV, pdl=pdl, tail=True)
    three.fused = TailBuild(three, compile_in_tail=False, **three.topk_params)
    tok, par, dep, _, _, n = step.tree

    def whole(s):
        return [lambda: s.build(logits, root, prefix), lambda: s.walk(choices)]

    def compile_(w, r, gather):
        return lambda: step.mask_kernel.compile_tree_arrays(par, dep, n, prefix, L, out=step.compiled, pdl=pdl,
                                                            num_warps=w, rows_per_program=r, gather=gather)

    def topk_build():
        step.topk_kernel.topk_logprobs(logits, step.k, out=(step.vals, step.ids), **step.topk_params)
        step.build_kernel.build_tree_arrays(step.vals, step.ids, step.budget, root, 0, out=step.tree,
                                            method=step.build_method, pdl=pdl)

    first_out = tail.fused.first  # buffers the graph keeps (its arrays are unused)

    def first_pass():
        step.topk_kernel.first_pass(logits, step.k, step.topk_block, pdl=pdl, out=first_out)

    b = f"b{budget}"
    return step, {
        f"{b} step: four launches + walk, PDL (default)": (step, whole(step)),
        f"{b} step: compile by gather": (step, [topk_build, compile_(4, None, True), lambda: step.walk(choices)]),
        f"{b} step: tail (two launches) + walk, PDL": (tail, whole(tail)),
        f"{b} step: tail + walk, plain launches": (tail_plain, whole(tail_plain)),
        f"{b} step: tail without the compile, compile 4w gather, walk, PDL": (three, whole(three)),
        f"{b} step: fused (one launch) + walk, PDL": (fused, whole(fused)),
        f"{b} first pass + walk": (None, [first_pass, lambda: step.walk(choices)]),
        f"{b} compile alone 4w/4 rows, loads": (step, [compile_(4, None, False)]),
        f"{b} compile alone 4w/4 rows, gather": (step, [compile_(4, None, True)]),
        f"{b} compile alone 1w/16 rows, loads": (step, [compile_(1, 16, False)]),
        f"{b} compile alone 1w/16 rows, gather": (step, [compile_(1, 16, True)]),
    }


def main():
    torch.manual_seed(0)
    logits = (torch.randn(L, V, device=DEV) * 3).to(torch.bfloat16)
    root, prefix = torch.tensor([1], device=DEV), torch.tensor([100], device=DEV)
    graphs = {}
    keep = []  # the steps' buffers, alive while their graphs replay
    for budget in BUDGETS:
        ref_step, arms = variants(budget, logits, root, prefix)
        keep.append(arms)
        ref = None
        for name, (owner, fns) in arms.items():
            run = lambda fns=fns: [f() for f in fns]  # noqa: E731
            run()
            run()  # twice: the tail's and the fused build's counters must be back at zero
            if owner is not None:
                arrays = [t.clone() for t in owner.tree + owner.compiled + owner.walked]
                if ref is None:
                    ref = arrays
                    print(f"b{budget}: commit length {int(owner.walked[2][0])} of {int(owner.tree[5][0])} nodes")
                same = all(torch.equal(a, b) for a, b in zip(arrays, ref))
                print(name, "same" if same else "MISMATCH", flush=True)
            if not SMOKE:
                graphs[name] = graphed(run)
    if SMOKE:
        return
    fill = torch.empty(1, device=DEV)
    graphs["a replay alone (one fill)"] = graphed(lambda: fill.fill_(1.0))
    interleaved_rounds(graphs, logits, ROUNDS, name_width=48)


main()
