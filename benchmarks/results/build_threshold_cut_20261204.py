"""The threshold build with its own tie order at the cut (tree_build/threshold.py, method "threshold") against the
serial build, in the whole step (top-K, build, compile, walk) and alone, in CUDA graphs, with today's path, same
run (H200). Per draw: whether the budget splits a tie at the cut (a DFS on the CPU over the step's own top-K
table), whether the threshold build fell back to the serial one, and whether the two steps' arrays are equal.

    python benchmarks/results/build_threshold_cut_20261204.py [OUT_DIR]
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
from ddtree_engine.kernels.tree_build import kernel as build_kernel  # noqa: E402
from ddtree_engine.kernels.tree_build import reference  # noqa: E402
from ddtree_engine.kernels.tree_step import TreeStep  # noqa: E402

device = torch.device("cuda")
L, V = 15, 151936
bench = lambda fn, rep=200: do_bench(fn, warmup=25, rep=rep, return_mode="median") * 1e3  # noqa: E731
root = torch.tensor([1], device=device)
prefix = torch.tensor([100], device=device)


def tie_at_cut(vals, budget):
    rows = vals.double().tolist()
    chosen = reference.select_prefixes(rows, budget, 0)
    t = min(c[3] for c in chosen)
    tied, stack = 0, [(0.0, 0)]
    while stack:
        score, d = stack.pop()
        for x in rows[d] if d < L else ():
            if score + x < t:
                break
            tied += score + x == t
            stack.append((score + x, d + 1))
    return tied, sum(1 for c in chosen if c[3] == t)


rows = []
for kind, scale, draws in (("random", 3.0, 3), ("peaked", 3.0, 2), ("mild", 1.0, 2)):
    for draw in range(draws):
        torch.manual_seed(1000 * draw + len(kind))
        logits = torch.randn(L, V, device=device) * scale
        if kind == "peaked":
            logits[:, 7] += 30.0
        logits = logits.to(torch.bfloat16)
        for budget in (64, 128, 256):
            steps = {m: TreeStep(L, V, budget, 8, device, build_method=m) for m in ("serial", "threshold")}
            choices = torch.zeros(steps["serial"].num_rows, dtype=torch.long, device=device)
            row = {"logits": kind, "draw": draw, "budget": budget}
            for m, s in steps.items():
                def run(s=s):
                    s.build(logits, root, prefix)
                    s.walk(choices)
                run()
                row[f"{m}_step_us"] = bench(graphed(run).replay)
                build = lambda s=s, m=m: s.build_kernel.build_tree_arrays(s.vals, s.ids, budget, root, 0, out=s.tree, method=m)  # noqa: E731
                row[f"{m}_build_us"] = bench(graphed(build).replay)
            a, b = steps["serial"], steps["threshold"]
            row["equal"] = all(torch.equal(x, y) for x, y in zip(a.tree + a.compiled + a.walked, b.tree + b.compiled + b.walked))
            flag = torch.full((1,), -1, dtype=torch.int64, device=device)
            build_kernel.build_tree_arrays(b.vals, b.ids, budget, root, 0, method="threshold", fell_back=flag)
            row["fell_back"] = int(flag[0])
            row["tied_at_cut"], row["tied_chosen"] = tie_at_cut(b.vals.cpu(), budget)
            row["today_us"] = bench(lambda: today(logits, budget, 8), rep=400)
            row["today_over_serial_step"] = row["today_us"] / row["serial_step_us"]
            row["today_over_threshold_step"] = row["today_us"] / row["threshold_step_us"]
            rows.append(row)
            print(json.dumps(row), flush=True)
if len(sys.argv) > 1:
    Path(sys.argv[1], "build_threshold_cut_20261204.json").write_text(json.dumps(rows, indent=1))
print(f"{'logits':>7} {'b':>4} {'tie':>6} fb eq {'serial step':>11} {'thr step':>9} {'serial build':>12} {'thr build':>9} "
      f"{'today':>7} {'today/serial':>12} {'today/thr':>9}")
for r in rows:
    print(f"{r['logits']:>7} {r['budget']:>4} {r['tied_at_cut']:>3}/{r['tied_chosen']:<2} {r['fell_back']:>2} {int(r['equal']):>2} "
          f"{r['serial_step_us']:>11.1f} {r['threshold_step_us']:>9.1f} {r['serial_build_us']:>12.1f} {r['threshold_build_us']:>9.1f} "
          f"{r['today_us']:>7.0f} {r['today_over_serial_step']:>11.1f}x {r['today_over_threshold_step']:>8.1f}x")
