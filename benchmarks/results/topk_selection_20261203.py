"""The top-K pass's selections, `tl.topk` against K rounds of "max, then drop it" (issue 10), on the H200.

Each launch is captured 20 times in one CUDA graph; per launch = replay time / 20 (a graph of one launch is
printed too). Rows for the current kernel (kernels/topk_logprobs/kernel.py) and the one before it, saved as
.out/scratch/tk_old.py by:  git show 6cea43b:engine_patches/ddtree_engine/src/ddtree_engine/kernels/topk_logprobs/kernel.py
Both give the same ids and log-probs on the logits timed (checked, printed). Then the step's stages at budgets
15, 22, 64 (TreeStep, four launches or one) and an empty kernel and torch's argmax for scale.

    PYTHONPATH=engine_patches/ddtree_engine/src python benchmarks/results/topk_selection_20261203.py
"""
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

sys.path.insert(0, ".out/scratch")
import tk_old  # noqa: E402
from ddtree_engine.kernels.topk_logprobs import kernel as tk  # noqa: E402
from ddtree_engine.kernels.tree_step import TreeStep  # noqa: E402

L, V, K = 15, 151_936, 8
dev = "cuda"
torch.manual_seed(0)
x = (torch.randn(L, V, device=dev) * 3).to(torch.bfloat16)


@triton.jit
def _empty(out_ptr):
    tl.store(out_ptr + tl.program_id(0) * 0, 0.0)


def per_launch(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    one, many = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(one):
        fn()
    with torch.cuda.graph(many):
        for _ in range(reps):
            fn()
    t1 = do_bench(one.replay, warmup=25, rep=150, return_mode="median") * 1e3
    tn = do_bench(many.replay, warmup=25, rep=150, return_mode="median") * 1e3
    return t1, tn / reps


def row(name, fn):
    t1, tn = per_launch(fn)
    print(f"{name:44s} graph of one {t1:7.2f} us   per launch in a graph of 20 {tn:7.2f} us", flush=True)


out1 = torch.empty(1, device=dev)
row("empty kernel (1 program)", lambda: _empty[(1,)](out1))
row("torch argmax", lambda: x.argmax(-1))
for block, group, warps in [(4096, 8, 4), (2048, 8, 4), (8192, 8, 8), (1024, 8, 1), (4096, 16, 4)]:
    tag = f"{block}/{group}/{warps}w"
    c = tk.first_pass_constants(V, K, block, group)
    nch = triton.cdiv(V, block)
    keys, mx, sm = tk.first_pass_buffers(L, nch, c["KP"], dev)
    vals = torch.empty(L, K, dtype=torch.float64, device=dev)
    ids = torch.empty(L, K, dtype=torch.int64, device=dev)
    ov, oi = tk_old.topk_logprobs(x, K, block=block, group=group, num_warps=warps)
    nv, ni = tk.topk_logprobs(x, K, block=block, group=group, num_warps=warps)
    print(f"{tag}: same ids and log-probs as before: {torch.equal(ni, oi) and torch.equal(nv, ov)}")
    row(f"{tag} first pass, tl.topk", lambda: tk.first_pass(x, K, block=block, group=group, num_warps=warps, out=(keys, mx, sm)))
    row(f"{tag} first pass, rounds (before)", lambda: tk_old.first_pass(x, K, block=block, group=group, num_warps=warps, out=(keys, mx, sm)))
    for mw in (1, 4):
        row(f"{tag} merge {mw}w, K best blocks, tl.topk", lambda mw=mw: tk._merge_topk[(L,)](
            keys, mx, sm, nch, vals, ids, K=K, KP=c["KP"], CP=c["CP"], BLOCK=c["BLOCK"], num_warps=mw))
        row(f"{tag} merge {mw}w, rounds (before)", lambda mw=mw: tk_old._merge_topk[(L,)](
            keys, mx, sm, nch, vals, ids, K=K, KP=c["KP"], CP=c["CP"], num_warps=mw))
    row(f"{tag} both, defaults' merge warps", lambda: tk.topk_logprobs(x, K, block=block, group=group, num_warps=warps, out=(vals, ids)))
    row(f"{tag} both, before (merge 4w)", lambda: tk_old.topk_logprobs(x, K, block=block, group=group, num_warps=warps, out=(vals, ids)))
root, prefix = torch.tensor([5], device=dev), torch.tensor([100], device=dev)
for budget in (15, 22, 64):
    for fused in (False, True):
        st = TreeStep(L, V, budget, K, dev, fused=fused)
        choice = torch.randint(0, V, (st.num_rows,), device=dev)
        row(f"b{budget} {'one launch' if fused else 'four launches'}: build + walk",
            lambda st=st, c=choice: (st.build(x, root, prefix), st.walk(c)))
