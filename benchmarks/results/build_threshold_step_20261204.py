"""The whole step (top-K, build, compile, walk) in a CUDA graph with the serial and the threshold build,
against today's path, same run (H200); the two steps' arrays must be equal.

Measured with the threshold build of commit f9cbc85 (its code: git show
f9cbc85:benchmarks/results/build_threshold_step_20261204.diff), before it cut ties itself; method "threshold" is in
the tree since (build_threshold_cut_20261204.py measures it as landed). Runs against the tree as it is:
    python benchmarks/results/build_threshold_step_20261204.py [OUT_DIR]
"""

import json
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "engine_patches" / "ddtree_engine" / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_tree_step import graphed, today  # noqa: E402
from ddtree_engine.kernels.tree_step import TreeStep  # noqa: E402

device = torch.device("cuda")
torch.manual_seed(0)
L, V = 15, 151936
bench = lambda fn, rep=200: do_bench(fn, warmup=25, rep=rep, return_mode="median") * 1e3  # noqa: E731
root = torch.tensor([1], device=device)
prefix = torch.tensor([100], device=device)
rows = []
for kind in ("random", "peaked"):
    logits = torch.randn(L, V, device=device) * 3
    if kind == "peaked":
        logits[:, 7] += 30.0
    logits = logits.to(torch.bfloat16)
    for budget in (64, 128, 256):
        steps = {m: TreeStep(L, V, budget, 8, device, build_method=m) for m in ("serial", "threshold")}
        choices = torch.zeros(steps["serial"].num_rows, dtype=torch.long, device=device)
        row = {"logits": kind, "budget": budget}
        for m, s in steps.items():
            def run(s=s):
                s.build(logits, root, prefix)
                s.walk(choices)
            run()
            row[f"{m}_graph_us"] = bench(graphed(run).replay)
        a, b = steps["serial"], steps["threshold"]
        row["equal"] = all(torch.equal(x, y) for x, y in zip(a.tree + a.compiled + a.walked, b.tree + b.compiled + b.walked))
        row["today_us"] = bench(lambda: today(logits, budget, 8), rep=400)
        row["today_over_serial"] = row["today_us"] / row["serial_graph_us"]
        row["today_over_threshold"] = row["today_us"] / row["threshold_graph_us"]
        rows.append(row)
        print(json.dumps(row))
if len(sys.argv) > 1:
    Path(sys.argv[1], "build_threshold_step_20261204.json").write_text(json.dumps(rows, indent=1))
