"""The sorted-frontier build against the heap build on the H200 (trees equal, times in CUDA graphs), 2026-12-04.

Needs the tree of build_sorted_frontier_20261204.diff (method="sorted"; the one-pop kernel measured first is
build_sorted_frontier_one_pop_20261204.py as that tree's tree_build/sorted.py). Results: build_sorted_frontier_20261204.json.
"""
import json, os, sys, torch
sys.path.insert(0, "engine_patches/ddtree_engine/src")
from triton.testing import do_bench
sys.path.insert(0, "benchmarks")
from bench_tree_step import graphed  # the bench's CUDA-graph capture (a side-stream run first: Triton compiles there)
from ddtree_engine.kernels.tree_build import kernel, reference
from ddtree_engine.kernels.topk_logprobs import reference as tr

dev = "cuda"
bench = lambda fn: do_bench(fn, warmup=25, rep=150, return_mode="median") * 1e3
res = {"times": [], "bad": []}
root = torch.tensor([1], device=dev)
for kind, scale in (("random", 3.0), ("peaked", 12.0)):
    for budget in (15, 22, 64, 256):
        torch.manual_seed(budget)
        logits = torch.randn(15, 4096) * scale
        if kind == "peaked":
            logits[:, 0] += 30
        vals, ids = tr.sorted_topk_logprobs(logits, 8)
        want = reference.build_tree_arrays(vals, ids, budget, 1, 0)
        vd, idd = vals.to(dev), ids.to(dev)
        row = {"kind": kind, "budget": budget}
        for method, warps in (("serial", None), ("sorted", 1), ("sorted", 2), ("sorted", 4), ("sorted", 8)):
            out = kernel.build_tree_arrays(vd, idd, budget, root, 0, method=method, num_warps=warps)
            torch.cuda.synchronize()
            same = all(torch.equal(a.cpu(), b) for a, b in zip(out, want))
            if not same: res["bad"].append([kind, budget, method, warps])
            fn = lambda: kernel.build_tree_arrays(vd, idd, budget, root, 0, out=out, method=method, num_warps=warps)
            row[f"{method}{warps or ''}"] = bench(graphed(fn).replay)
        res["times"].append(row)
        print(row, flush=True)
# random shapes, spines, ties, on the GPU
g = torch.Generator().manual_seed(7)
n = 0
for seed in range(60):
    depths = int(torch.randint(1, 16, (1,), generator=g)); budget = int(torch.randint(1, 300, (1,), generator=g))
    k = min(int(torch.randint(1, 9, (1,), generator=g)), budget); spine = int(torch.randint(0, 5, (1,), generator=g)) * (seed % 2)
    logits = torch.randint(0, 3, (depths, 40), generator=g).float() if seed % 3 == 0 else torch.randn(depths, 40, generator=g) * (12 if seed % 4 == 0 else 2)
    vals, ids = tr.sorted_topk_logprobs(logits, k)
    want = reference.build_tree_arrays(vals, ids, budget, 3, spine)
    for w in (1, 2, 4, 8):
        out = kernel.build_tree_arrays(vals.to(dev), ids.to(dev), budget, torch.tensor([3], device=dev), spine, method="sorted", num_warps=w)
        n += 1
        if not all(torch.equal(a.cpu(), b) for a, b in zip(out, want)):
            res["bad"].append(["shape", seed, depths, budget, k, spine, w])
print("random shapes checked", n, "bad", res["bad"])
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "sorted.json"), "w"), indent=1)
