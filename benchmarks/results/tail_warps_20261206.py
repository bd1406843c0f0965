"""Issue 10, budget 15: the step's walk and compile by warps, the whole step in CUDA graphs, interleaved rounds.

The walk is one program of 4 warps over a 16-row tree taking max_depth (15) steps, each a tl.min across the 4 warps
(shared memory and a barrier each); the compile 4 programs of 4 rows, 4 warps. Here the step (TreeStep's default,
PDL) with the walk and the compile at fewer warps, and each alone, graphs measured in ROUNDS interleaved rounds
(median of the rounds' do_bench medians: bench_tree_step.interleaved_rounds), same logits as bench_tree_step.py ([15, 151,936] bf16, randn * 3, seed 0).
Every variant's arrays are checked against the default's.

    PYTHONPATH=engine_patches/ddtree_engine/src python benchmarks/results/tail_warps_20261206.py [--smoke]
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, as the earlier scripts here
from bench_tree_step import graphed, interleaved_rounds  # noqa: E402  (it puts the engine's src on the path)
from ddtree_engine.kernels.tree_step import TreeStep  # noqa: E402

SMOKE = "--smoke" in sys.argv
L, V = (3, 3000) if SMOKE else (15, 151_936)
DEV = "cpu" if SMOKE else "cuda"
ROUNDS = 1 if SMOKE else 7


def main():
    torch.manual_seed(0)
    logits = (torch.randn(L, V, device=DEV) * 3).to(torch.bfloat16)
    root, prefix = torch.tensor([1], device=DEV), torch.tensor([100], device=DEV)
    budget = 5 if SMOKE else 15
    pdl = not SMOKE
    step = TreeStep(L, V, budget, 8, DEV, pdl=pdl)
    step.build(logits, root, prefix)
    # Choices that follow the top-1 chain (the walk goes deep) : the target's choice at a node = its first child's token.
    tokens, parents = step.tree[0], step.tree[1]
    choices = torch.full((step.num_rows,), 7, dtype=torch.long, device=DEV)
    for i in reversed(range(1, int(step.tree[5][0]))):
        choices[int(parents[i])] = tokens[i]
    tok, par, dep, _, _, n = step.tree

    def walk(w):
        return lambda: step.walk_kernel.walk_arrays(tok, par, n, choices, L, out=step.walked, pdl=pdl, num_warps=w)

    def compile_(w, r):
        return lambda: step.mask_kernel.compile_tree_arrays(par, dep, n, prefix, L, out=step.compiled, pdl=pdl,
                                                            num_warps=w, rows_per_program=r)

    def build():
        step.topk_kernel.topk_logprobs(logits, step.k, out=(step.vals, step.ids), **step.topk_params)
        step.build_kernel.build_tree_arrays(step.vals, step.ids, step.budget, root, 0, out=step.tree,
                                            method=step.build_method, pdl=pdl)

    variants = {
        "step: compile 4w/4 rows, walk 4w (default)": [build, compile_(4, None), walk(4)],
        "step: walk 2w": [build, compile_(4, None), walk(2)],
        "step: walk 1w": [build, compile_(4, None), walk(1)],
        "step: compile 1w/4 rows, walk 1w": [build, compile_(1, None), walk(1)],
        "step: compile 1w/16 rows, walk 1w": [build, compile_(1, 16), walk(1)],
        "step: compile 2w/16 rows, walk 1w": [build, compile_(2, 16), walk(1)],
        "step: compile 4w/16 rows, walk 1w": [build, compile_(4, 16), walk(1)],
        "walk alone 4w": [walk(4)], "walk alone 1w": [walk(1)],
        "compile alone 4w/4 rows": [compile_(4, None)], "compile alone 1w/16 rows": [compile_(1, 16)],
        "compile alone 1w/4 rows": [compile_(1, None)],
    }
    ref = None
    graphs = {}
    for name, fns in variants.items():
        run = lambda fns=fns: [f() for f in fns]  # noqa: E731
        run()
        arrays = [t.clone() for t in step.tree + step.compiled + step.walked]
        if ref is None:
            ref = arrays
            print(f"commit length {int(step.walked[2][0])} of {int(step.tree[5][0])} nodes")
        same = all(torch.equal(a, b) for a, b in zip(arrays, ref))
        print(name, "same" if same else "MISMATCH", flush=True)
        if not SMOKE:
            graphs[name] = graphed(run)
    if SMOKE:
        return
    fill = torch.empty(1, device=DEV)
    graphs["a replay alone (one fill)"] = graphed(lambda: fill.fill_(1.0))
    interleaved_rounds(graphs, logits, ROUNDS)


main()
