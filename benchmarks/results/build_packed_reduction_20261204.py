"""The heap build with a narrower reduction, H200 2026-12-04 ~05:25 UTC: RED 0 today's 5 values (score, key, parent score,
runner-up score and key), RED 1 the two int32 keys packed in one int64 (4 values), RED 2 that and the parent score read
from a mirrored workspace row (3 values). Build alone in CUDA graphs, twice each; then 60 random shapes at 1 and 4 warps
against the reference. Kernel: build_packed_reduction_kernel_20261204.py; harness: build_packed_reduction_harness_20261204.py.
Results: build_packed_reduction_20261204.json. Run from the repository root.
"""
import sys, json, os, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_packed_reduction_harness_20261204 import run, tr, reference, check
from triton.testing import do_bench
sys.path.insert(0, "benchmarks")
from bench_tree_step import graphed  # the bench's CUDA-graph capture (a side-stream run first: Triton compiles there)
bench = lambda fn: do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
rows = []
root = torch.tensor([1], device="cuda")
for kind, scale, peak in (("random", 3.0, 0), ("peaked", 12.0, 30)):
    for budget in (15, 64, 256):
        torch.manual_seed(budget)
        logits = torch.randn(15, 4096) * scale; logits[:, 0] += peak
        vals, ids = tr.sorted_topk_logprobs(logits, 8)
        want = reference.build_tree_arrays(vals, ids, budget, 1, 0)
        vd, idd = vals.to("cuda").contiguous(), ids.to("cuda").contiguous()
        row = {"kind": kind, "budget": budget}
        for rep in range(2):
            for red in (0, 1, 2):
                out, ws = run(vd, idd, budget, root, 0, red)
                torch.cuda.synchronize()
                ok = all(torch.equal(a.cpu(), b) for a, b in zip(out, want))
                row[f"red{red}_{rep}"] = bench(graphed(lambda: run(vd, idd, budget, root, 0, red, out=out, ws=ws)).replay)
                row[f"red{red}_same"] = ok
        rows.append(row); print(row, flush=True)
bad = check(60)
print("random shapes bad", bad)
json.dump({"rows": rows, "bad": bad}, open(os.path.join(os.environ.get("OUT", "."), "packed.json"), "w"), indent=1)
