"""Where a sorted-frontier pop's ~0.35 us goes: the one-pop kernel's loop (no layout) by variant, CUDA graphs (H200, 2026-12-04).

The kernel is build_sorted_frontier_diag_kernel_20261204.py beside this file (the one-pop kernel with its imports inlined, the
layout left out and constexpr switches: no barrier, cache modifiers, constant values, no entry stores). Results:
build_sorted_frontier_diag_20261204.json. Run from the repository root: python benchmarks/results/build_sorted_frontier_diag_20261204.py
"""
import json, os, sys, torch
sys.path.insert(0, "engine_patches/ddtree_engine/src"); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from triton.testing import do_bench
sys.path.insert(0, "benchmarks")
from bench_tree_step import graphed  # the bench's CUDA-graph capture (a side-stream run first: Triton compiles there)
from ddtree_engine.kernels.tree_build import kernel
from ddtree_engine.kernels.topk_logprobs import reference as tr
from build_sorted_frontier_diag_kernel_20261204 import _build_tree_sorted
dev = "cuda"
bench = lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
VARIANTS = {"base": {}, "no barrier": dict(NOBAR=True), "frontier loads .cg": dict(CM=".cg"), "frontier loads .ca": dict(CM=".ca"),
            "frontier loads .cv": dict(CM=".cv"), "vals loads .ca": dict(VCM=".ca"), "no vals loads": dict(VCONST=True),
            "no entry stores": dict(NOSTORE=True), "no barrier, no vals loads": dict(NOBAR=True, VCONST=True)}
rows = []
torch.manual_seed(0)
logits = torch.randn(15, 4096) * 3
for budget, warps in ((15, 1), (64, 1), (256, 4)):
    vals, ids = tr.sorted_topk_logprobs(logits, 8)
    vd, idd = vals.to(dev), ids.to(dev)
    ws, wss = kernel.workspaces(budget, False, dev)
    ws = torch.zeros(ws.numel() + 2 * 256, dtype=torch.int64, device=dev); wss = torch.zeros(wss.numel() + 4 * 256, dtype=torch.float64, device=dev)
    out = tuple(torch.zeros(budget + 1, dtype=torch.int64, device=dev) for _ in range(4)) + (torch.zeros(budget + 1, dtype=torch.float64, device=dev), torch.zeros(1, dtype=torch.int64, device=dev))
    shape = dict(kernel.launch_constants(budget, 8, False), NF=kernel.triton.next_power_of_2((budget + 1) // 2) if budget > 2 else 2)
    root = torch.tensor([1], device=dev)
    empty = torch.zeros(1, device=dev)
    floor = bench(graphed(lambda: empty.fill_(1.0)).replay)
    row = {"budget": budget, "warps": warps, "graph floor (one fill)": floor}
    for name, flags in VARIANTS.items():
        f = {**dict(NOBAR=False, CM="", VCM="", VCONST=False, NOSTORE=False), **flags}
        fn = lambda: _build_tree_sorted[(1,)](vd, idd, root, 15, 0, ws, wss, *out, **shape, **f, num_warps=warps)
        fn(); torch.cuda.synchronize()
        row[name] = bench(graphed(fn).replay)
    rows.append(row); print(row, flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "diag.json"), "w"), indent=1)
