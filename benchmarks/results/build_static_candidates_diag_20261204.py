"""Where the static selection's time goes (tree_build/static.py of build_static_candidates_20261204.diff), H200.

The kernel below is `_build_tree_static` with switches, build alone in a CUDA graph, L 15, K 8, random logits
(scale 3), budgets 15 and 22, 4 and 8 warps:

- TOPK 0: the cut is the best key (one tl.max) instead of the budget-th by tl.topk over int64 keys; 2: tl.topk
  over int32 keys (the fp64 scores rounded to fp32, then ordered as the int64 ones; a timing only);
- GATHER 0: scores from the table alone (no log-prob loads);
- LAYOUT 0: each kept candidate written at its own slot (no cumulative sum, no place store, barrier and parent load);
- FALLBACK 0: the serial build is not compiled in (a tie at the boundary would give a wrong tree).

Needs the diff applied (it imports tree_build.static) and a CUDA GPU:
    git apply benchmarks/results/build_static_candidates_20261204.diff
    python benchmarks/results/build_static_candidates_diag_20261204.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "engine_patches" / "ddtree_engine" / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_tree_step import graphed  # noqa: E402
from ddtree_engine.kernels.topk_logprobs import reference as topk_reference  # noqa: E402
from ddtree_engine.kernels.tree_build import kernel, static  # noqa: E402
from ddtree_engine.kernels.tree_build.kernel import _build_tree  # noqa: E402
from ddtree_engine.kernels.tree_build.layout import _write_tree  # noqa: E402
from ddtree_engine.kernels.tree_build.static import _FLIP, _NO_KEY, _SPINE_KEY  # noqa: E402


@triton.jit
def _static_diag(
    vals_ptr, ids_ptr, root_ptr, L, spine, ws_ptr, ws_score_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr, score_ptr, n_ptr,
    tab_ptr, place_ptr,
    BUDGET: tl.constexpr, K: tl.constexpr, B: tl.constexpr, NB: tl.constexpr, NP: tl.constexpr, COLS: tl.constexpr,
    SD: tl.constexpr, SR: tl.constexpr, SC: tl.constexpr, KNONE: tl.constexpr,
    LD: tl.constexpr, CP: tl.constexpr, KT: tl.constexpr,
    TOPK: tl.constexpr, GATHER: tl.constexpr, LAYOUT: tl.constexpr, FALLBACK: tl.constexpr,
):
    c = tl.arange(0, CP)
    dep = tl.load(tab_ptr + c)
    valid = dep >= 0
    score = tl.zeros([CP], dtype=tl.float64)
    on_spine = valid & (dep < spine)
    for j in tl.static_range(LD):
        r = tl.load(tab_ptr + (3 + j) * CP + c)
        if GATHER:
            score = score + tl.load(vals_ptr + j * K + r, mask=r >= 0, other=0.0)
        else:
            score = score - r.to(tl.float64)
        on_spine = on_spine & (r <= 0)
    bits = score.to(tl.int64, bitcast=True)
    key = tl.where(bits < 0, bits ^ _FLIP, bits)
    key = tl.where(on_spine, _SPINE_KEY, key)
    key = tl.where(valid, key, _NO_KEY)
    t = tl.arange(0, KT)
    if TOPK == 1:
        best = tl.topk(key, KT)
        cut = tl.max(tl.where(t == BUDGET - 1, best, _NO_KEY), axis=0)
        after = tl.max(tl.where(t == BUDGET, best, _NO_KEY), axis=0)
    elif TOPK == 2:
        b32 = score.to(tl.float32).to(tl.int32, bitcast=True)
        k32 = tl.where(b32 < 0, b32 ^ 2147483647, b32)
        k32 = tl.where(valid, k32, -2147483647)
        best32 = tl.topk(k32, KT)
        cut32 = tl.max(tl.where(t == BUDGET - 1, best32, -2147483647), axis=0)
        cut = tl.max(tl.where(k32 == cut32, key, _NO_KEY), axis=0)
        after = _NO_KEY
    else:
        cut = tl.max(key, axis=0)
        after = _NO_KEY
    tied = (cut != _NO_KEY) & (cut == after)
    tl.store(place_ptr + CP, tied.to(tl.int32))
    if FALLBACK and tied:
        _build_tree(vals_ptr, ids_ptr, root_ptr, L, spine, ws_ptr, ws_score_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr,
                    score_ptr, n_ptr, BUDGET, K, B, NB, NP, COLS, SD, SR, SC, KNONE)
    else:
        chosen = valid & (key >= cut)
        par = tl.load(tab_ptr + 2 * CP + c)
        rnk = tl.load(tab_ptr + CP + c)
        if LAYOUT:
            place = tl.cumsum(chosen.to(tl.int32), axis=0)
            tl.store(place_ptr + c, place)
            tl.debug_barrier()
            par_place = tl.load(place_ptr + par, mask=chosen & (par >= 0), other=0)
        else:
            place = (c + 1) % (BUDGET + 1)
            par_place = par + 1
        n_chosen = tl.sum(chosen.to(tl.int32), axis=0)
        _write_tree(place.to(tl.int64), par_place.to(tl.int64), dep, rnk, score, chosen & (place <= BUDGET),
                    n_chosen, root_ptr, ids_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr, score_ptr, n_ptr, BUDGET, K, NP)


VARIANTS = {  # name: (TOPK, GATHER, LAYOUT, FALLBACK)
    "as built": (1, 1, 1, 1),
    "no fallback compiled": (1, 1, 1, 0),
    "int32 topk": (2, 1, 1, 1),
    "no topk": (0, 1, 1, 1),
    "no gathers": (1, 0, 1, 1),
    "no layout": (1, 1, 0, 1),
    "none of the three": (0, 0, 0, 0),  # top-K, loads and layout off, and the fallback too (the name is the JSON's key)
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or ".")
    args = parser.parse_args()
    from triton.testing import do_bench

    bench = lambda fn: do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3  # noqa: E731
    dev, depths, k = "cuda", 15, 8
    torch.manual_seed(1)
    vals, ids = topk_reference.sorted_topk_logprobs(torch.randn(depths, 4096) * 3.0, k)
    vals, ids, root = vals.to(dev), ids.to(dev), torch.tensor([1], device=dev)
    results = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__}
    fill = torch.empty(1, device=dev)
    results["replay_us"] = bench(graphed(lambda: fill.fill_(1.0)).replay)
    print(f"graph replay alone {results['replay_us']:.1f} us")
    for budget in (15, 22):
        ref = kernel.build_tree_arrays(vals, ids, budget, root, 0)
        row = {"serial": bench(graphed(lambda b=budget, o=ref: kernel.build_tree_arrays(vals, ids, b, root, 0, out=o)).replay)}
        ws, ws_score = kernel.workspaces(budget, False, dev)
        consts = {**kernel.launch_constants(budget, k, False), **static.constants(depths, k, budget)}
        tab, sc = static.table(depths, k, budget, dev), static.scratch(depths, k, budget, dev)
        for warps in (4, 8):
            for name, (tk, ga, la, fb) in VARIANTS.items():
                out = tuple(torch.empty_like(t) for t in ref)

                def fn(out=out, tk=tk, ga=ga, la=la, fb=fb, warps=warps):
                    _static_diag[(1,)](vals, ids, root, depths, 0, ws, ws_score, *out, tab, sc, **consts, TOPK=tk,
                                       GATHER=ga, LAYOUT=la, FALLBACK=fb, num_warps=warps)

                fn()
                torch.cuda.synchronize()
                same = all(torch.equal(p, q) for p, q in zip(out, ref))
                row[f"{name}, {warps}w"] = bench(graphed(fn).replay)
                row[f"{name}, {warps}w same tree"] = same
        results[f"b{budget}"] = row
        print(f"budget {budget}: serial {row['serial']:.1f} us")
        for key, value in row.items():
            if key != "serial" and not key.endswith("same tree"):
                print(f"  {key:28s} {value:6.1f} us  same tree {row[key + ' same tree']}")
    Path(args.out, "build_static_candidates_diag_20261204.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
