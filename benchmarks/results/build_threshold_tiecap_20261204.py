"""The threshold build alone at a given TIED_CAP (argv[1]), on the cut bench's random draws (build_threshold_cut_20261204.py:
seed 1000 * draw + 6, bf16 [15, 151,936] logits * 3, K 8), in a CUDA graph, checked against the reference. Run on the H200
on 2026-12-04 ~17:50 UTC with TIED_CAP 32 and the time left (55 s: budget 256 did not compile in it); the
figures at TIED_CAP 64 come from build_threshold_cut_20261204.txt. Output: build_threshold_tiecap_20261204.txt.

    python benchmarks/results/build_threshold_tiecap_20261204.py 32
"""

import sys, time, torch
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "engine_patches" / "ddtree_engine" / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from triton.testing import do_bench
from ddtree_engine.kernels.tree_build import threshold as th, kernel as bk, reference
from ddtree_engine.kernels.topk_logprobs import kernel as tk
from bench_tree_step import graphed
th.TIED_CAP = int(sys.argv[1])
dev = torch.device("cuda"); L, V = 15, 151936
root = torch.tensor([1], device=dev)
t0 = time.time()
for draw, budget in ((0, 64), (1, 64), (0, 256)):
    torch.manual_seed(1000 * draw + 6)
    logits = (torch.randn(L, V, device=dev) * 3).to(torch.bfloat16)
    vals, ids = tk.topk_logprobs(logits, 8)
    flag = torch.full((1,), -1, dtype=torch.int64, device=dev)
    out = bk.build_tree_arrays(vals, ids, budget, root, 0, method="threshold", fell_back=flag)
    want = reference.build_tree_arrays(vals.cpu(), ids.cpu(), budget, 1, 0)
    eq = all(torch.equal(a.cpu(), b) for a, b in zip(out, want))
    us = do_bench(graphed(lambda: bk.build_tree_arrays(vals, ids, budget, root, 0, out=out, method="threshold")).replay,
                  warmup=10, rep=50, return_mode="median") * 1e3
    print(f"TC {th.TIED_CAP} draw {draw} b{budget}: build {us:.1f} us, equal {eq}, fell_back {int(flag[0])}, t {time.time()-t0:.0f}s", flush=True)
