"""Harness of build_packed_reduction_20261204.py: launch the variant kernel, check it against the reference on random shapes."""
import sys, os, torch
sys.path.insert(0, "engine_patches/ddtree_engine/src"); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddtree_engine.kernels.tree_build import kernel, reference
from ddtree_engine.kernels.topk_logprobs import reference as tr
from build_packed_reduction_kernel_20261204 import _build_tree_v
dev = "cuda" if torch.cuda.is_available() else "cpu"
def run(vals, ids, budget, root, spine, red, warps=None, out=None, ws=None):
    depths, k = vals.shape
    n = budget + 1
    if out is None:
        out = tuple(torch.empty(n, dtype=torch.int64, device=dev) for _ in range(4)) + (torch.empty(n, dtype=torch.float64, device=dev), torch.empty(1, dtype=torch.int64, device=dev))
    nb = kernel.triton.next_power_of_2(budget)
    if ws is None:
        ws = (torch.empty(5 * nb, dtype=torch.int64, device=dev), torch.empty(2 * nb, dtype=torch.float64, device=dev))
    shape = dict(kernel.launch_constants(budget, k, False), num_warps=warps or kernel.default_warps(budget))
    _build_tree_v[(1,)](vals.contiguous(), ids.contiguous(), root, depths, min(spine, depths, budget), *ws, *out, RED=red, **shape)
    return out, ws
def check(nshapes):
    bad = []
    g = torch.Generator().manual_seed(5)
    for seed in range(nshapes):
        depths = int(torch.randint(1, 16, (1,), generator=g)); budget = int(torch.randint(1, 300, (1,), generator=g))
        k = min(int(torch.randint(1, 9, (1,), generator=g)), budget); spine = int(torch.randint(0, 5, (1,), generator=g)) * (seed % 2)
        logits = torch.randint(0, 3, (depths, 40), generator=g).float() if seed % 3 == 0 else torch.randn(depths, 40, generator=g) * (12 if seed % 4 == 0 else 2)
        vals, ids = tr.sorted_topk_logprobs(logits, k)
        if kernel.key_constants(budget, k) == kernel.INT64_KEYS: continue
        want = reference.build_tree_arrays(vals, ids, budget, 3, spine)
        for red in (1, 2):
            for w in ((1, 4) if dev == "cuda" else (1,)):
                out, _ = run(vals.to(dev), ids.to(dev), budget, torch.tensor([3], device=dev), spine, red, w)
                if not all(torch.equal(a.cpu(), b) for a, b in zip(out, want)):
                    bad.append((seed, depths, budget, k, spine, red, w))
    return bad
if __name__ == "__main__":
    print("bad", check(int(sys.argv[1])))
