"""The pop-free ("static") selection on the H200 (README: "A selection with no pops at all"), as run 2026-12-04 ~10:15 UTC.

1. the reference's trees: 6 shapes (L, K, budget, spine) by 40 logits (random, peaked, integer) at 1, 4 and 8 warps;
2. the build alone in CUDA graphs, L 15, K 8, budgets 15 and 22, serial against static at 1, 2, 4 and 8 warps;
3. the whole step in CUDA graphs (TreeStep serial, static, fused serial, fused static) against the argmax.

Needs the diff applied and a CUDA GPU, from the repository root (writes static_gpu.json to $OUT or .):
    git apply benchmarks/results/build_static_candidates_20261204.diff
    python benchmarks/results/build_static_candidates_20261204_bench.py
"""
import json, os, sys, time
from pathlib import Path
ROOT = Path.cwd()
sys.path.insert(0, str(ROOT / "engine_patches/ddtree_engine/src")); sys.path.insert(0, str(ROOT / "benchmarks"))
import torch, triton
from triton.testing import do_bench
from bench_tree_step import graphed, today
from ddtree_engine.kernels.tree_build import kernel, reference, static
from ddtree_engine.kernels.topk_logprobs import reference as topk_reference
from ddtree_engine.kernels.tree_step import TreeStep, reference_step
dev = "cuda"
res = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__}
bench = lambda fn, rep=200: do_bench(fn, warmup=25, rep=rep, return_mode="median") * 1e3
# 1. correctness on random shapes, 1/2/4/8 warps, vs the reference
bad = 0; n = 0; tied = 0; t0 = time.time()
for (L, k, b, sp) in ((15, 8, 15, 0), (15, 8, 22, 0), (15, 8, 15, 2), (7, 4, 22, 0), (6, 3, 30, 1), (4, 8, 12, 0)):
    for w in (1, 4, 8):
        for seed in range(40):
            g = torch.Generator().manual_seed(seed)
            kind = seed % 4
            x = torch.randn(L, 64, generator=g) * (12.0 if kind == 1 else 2.0)
            if kind == 2: x = torch.randint(0, 3, (L, 64), generator=g).float()
            vals, ids = topk_reference.sorted_topk_logprobs(x, k)
            want = reference.build_tree_arrays(vals, ids, b, 3, sp)
            sc = static.scratch(L, k, b, dev)
            got = kernel.build_tree_arrays(vals.to(dev), ids.to(dev), b, torch.tensor([3], device=dev), sp, method="static", num_warps=w, static_scratch=sc)
            n += 1; tied += int(sc[-1])
            if not all(torch.equal(gg.cpu(), ww) for gg, ww in zip(got, want)):
                bad += 1; print("MISMATCH", seed, L, b, k, sp, w)
res["random"] = {"runs": n, "mismatches": bad, "tied_fallbacks": tied, "s": time.time() - t0}
print("random shapes:", res["random"], flush=True)
# 2. build alone in graphs, L 15, K 8
L, V = 15, 151936
res["build"] = {}
for kind in ("random", "peaked"):
    torch.manual_seed(1)
    x = torch.randn(L, 4096) * (3.0 if kind == "random" else 14.0)
    vals, ids = topk_reference.sorted_topk_logprobs(x, 8)
    vals, ids = vals.to(dev), ids.to(dev); root = torch.tensor([1], device=dev)
    for b in (15, 22):
        row = {}
        ref = kernel.build_tree_arrays(vals, ids, b, root, 0)
        fn = lambda: kernel.build_tree_arrays(vals, ids, b, root, 0, out=ref)
        row["serial"] = bench(graphed(fn).replay)
        for w in (1, 2, 4, 8):
            out = tuple(torch.empty_like(t) for t in ref); sc = static.scratch(L, 8, b, dev)
            fn = lambda out=out, w=w, sc=sc: kernel.build_tree_arrays(vals, ids, b, root, 0, out=out, method="static", num_warps=w, static_scratch=sc)
            fn(); torch.cuda.synchronize()
            same = all(torch.equal(p, q) for p, q in zip(out, ref))
            row[f"static_{w}w"] = bench(graphed(fn).replay); row[f"static_{w}w_same"] = same; row[f"tied_{w}w"] = int(sc[-1])
        res["build"][f"{kind} b{b}"] = row
        print(kind, b, {k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
# 3. whole step in graphs
torch.manual_seed(0)
logits = (torch.randn(L, V, device=dev) * 3).to(torch.bfloat16)
root = torch.tensor([1], device=dev); prefix = torch.tensor([100], device=dev)
argmax_us = bench(lambda: logits.argmax(dim=-1))
out_a = logits.argmax(dim=-1)
argmax_graph_us = bench(graphed(lambda: out_a.copy_(logits.argmax(dim=-1))).replay)
res["argmax_us"], res["argmax_graph_us"] = argmax_us, argmax_graph_us
print(f"argmax {argmax_us:.1f} eager, {argmax_graph_us:.1f} graph", flush=True)
res["step"] = {}
for b in (15, 22):
    today_us = bench(lambda: today(logits, b, 8), rep=400)
    want_tree, want_comp, _ = reference_step(logits, b, 8, 1, 100, None)
    row = {"today_us": today_us}
    for name, kw in (("serial", {}), ("static", dict(build_method="static")), ("fused serial", dict(fused=True)),
                     ("fused static", dict(build_method="static", fused=True))):
        step = TreeStep(L, V, b, 8, dev, **kw)
        choices = torch.zeros(step.num_rows, dtype=torch.long, device=dev)
        step.build(logits, root, prefix); step.walk(choices); torch.cuda.synchronize()
        same = all(torch.equal(g.cpu(), w) for g, w in zip(step.tree[:4], want_tree[:4])) and torch.equal(step.compiled[0].cpu(), want_comp[0])
        def eager(step=step, choices=choices):
            step.build(logits, root, prefix); step.walk(choices)
        us = bench(graphed(eager).replay)
        row[name] = {"graph_us": us, "over_argmax": us / argmax_us, "over_argmax_graph": us / argmax_graph_us, "today_over": today_us / us, "same": same}
        print(f"b{b} {name:13s} {us:6.1f} us  {us/argmax_us:.2f}x argmax  {us/argmax_graph_us:.2f}x graphed  today/it {today_us/us:.1f}x same={same}", flush=True)
    res["step"][f"b{b}"] = row
out = Path(os.environ.get("OUT", ".")); (out / "static_gpu.json").write_text(json.dumps(res, indent=2))
