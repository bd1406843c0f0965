"""Parent-indexed Gated-DeltaNet tree verify on the kernels vs a chain and vs today's path,
measured in one run on one GPU (issue 10, item 5).

Qwen3.5-27B-class heads: value heads 48, key heads 16, dims 128, bf16 q/k/v, fp32 state, conv
dim 2*16*128 + 48*128 = 10,240 with a 4-tap kernel; 16 nodes. Rows per tree shape (chain 16,
star, binary, 4-ary, two random depth-major trees):

- recurrence `tree`: kernels/gdn_tree/kernel.py gated_delta_tree over the shape's parents
  (device tensor), keeping every node's state (what tree verify commits from);
- `chain, same kernel`: the tree path of the same kernel over a 16-chain's parents;
- `chain kernel`: the kernel's chain specialisation (no parent reads), every position's state
  kept: the DFLASH verify baseline (a chain verify also commits any prefix);
- `chain kernel, last state`: the chain specialisation keeping only the last state (prefill);
- `reference`: today's path, kernels/gdn_tree/reference.py (one PyTorch step per tree level);
- the conv likewise (`tree` through window_index, `chain` the chain specialisation, the
  reference), and the commit (kernel vs the PyTorch gather).

Ratios printed: tree / chain kernel (target <= 1.2), tree / chain through the same kernel,
reference / tree (the speedup over today). Times are triton.testing.do_bench medians (eager
launches) and do_bench_cudagraph medians (launch overhead removed, what a captured step pays).

    python benchmarks/bench_gdn_tree.py [--out DIR]   (JSON to DIR, else $OUT, else benchmarks/results/)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "engine_patches" / "ddtree_engine" / "src"))

import triton  # noqa: E402
from triton.testing import do_bench, do_bench_cudagraph  # noqa: E402

from ddtree_engine.core.hybrid import conv_window_index, l2norm  # noqa: E402
from ddtree_engine.kernels.gdn_tree import kernel, reference  # noqa: E402

H, HK, DK, DV, KSIZE = 48, 16, 128, 128, 4
CONV_DIM = 2 * HK * DK + H * DV
NODES = 16


def _git_revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        return rev.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _depth_major_random(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    parents = [-1] + [rng.randrange(i) for i in range(1, n)]
    order = [i for level in reference.node_levels(parents) for i in level]
    new = {old: j for j, old in enumerate(order)}
    return [-1 if parents[old] < 0 else new[parents[old]] for old in order]


SHAPES = {
    "chain 16": list(range(-1, NODES - 1)),
    "star 16": [-1] + [0] * (NODES - 1),
    "binary 16": [-1] + [(i - 1) // 2 for i in range(1, NODES)],
    "4-ary 16": [-1] + [(i - 1) // 4 for i in range(1, NODES)],
    "random 16 (a)": _depth_major_random(NODES, 1),
    "random 16 (b)": _depth_major_random(NODES, 2),
}


def _inputs(device: str):
    gen = torch.Generator(device=device).manual_seed(0)
    q = (l2norm(torch.randn(NODES, HK, DK, device=device, generator=gen)) * DK**-0.5).bfloat16()
    k = l2norm(torch.randn(NODES, HK, DK, device=device, generator=gen)).bfloat16()
    v = torch.randn(NODES, H, DV, device=device, generator=gen).bfloat16()
    g = -torch.rand(NODES, H, device=device, generator=gen)
    beta = torch.rand(NODES, H, device=device, generator=gen).bfloat16()
    s0 = torch.randn(H, DK, DV, device=device, generator=gen)
    x = torch.randn(NODES, CONV_DIM, device=device, generator=gen).bfloat16()
    window = torch.randn(KSIZE - 1, CONV_DIM, device=device, generator=gen).bfloat16()
    weight = torch.randn(CONV_DIM, KSIZE, device=device, generator=gen).bfloat16()
    bias = torch.randn(CONV_DIM, device=device, generator=gen).bfloat16()
    return (q, k, v, g, beta, s0), (x, window, weight, bias)


def _time(fn, rep: int, graph: bool = True) -> dict:
    fn()
    torch.cuda.synchronize()
    row = {"eager_us": do_bench(fn, rep=rep, return_mode="median") * 1e3}
    if graph:
        row["graph_us"] = do_bench_cudagraph(fn, rep=rep, return_mode="median") * 1e3
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--rep", type=int, default=200, help="do_bench rep (ms) per measurement")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gdn_tree needs a CUDA GPU")
    device = "cuda"
    info = {
        "gpu": torch.cuda.get_device_name(),
        "git": _git_revision(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "heads": {"value": H, "key": HK, "dk": DK, "dv": DV, "conv_dim": CONV_DIM, "conv_kernel": KSIZE},
        "nodes": NODES,
    }
    print(f"GPU {info['gpu']} | git {info['git']} | torch {info['torch']} | triton {info['triton']}")
    print(f"value heads {H}, key heads {HK}, dims {DK}, bf16 q/k/v, fp32 state, conv {CONV_DIM} x {KSIZE}, {NODES} nodes")
    (q, k, v, g, beta, s0), (x, window, weight, bias) = _inputs(device)
    rows: list[dict] = []

    def add(kind: str, shape: str, name: str, fn, graph: bool = True) -> dict:
        row = {"kind": kind, "shape": shape, "name": name, **_time(fn, args.rep, graph)}
        rows.append(row)
        return row

    # ---- recurrence ----
    chain_par = torch.tensor(SHAPES["chain 16"], dtype=torch.int32, device=device)
    base = add("recurrence", "chain 16", "chain kernel", lambda: kernel.gated_delta_tree(q, k, v, g, beta, None, s0, True))
    last = add("recurrence", "chain 16", "chain kernel, last state", lambda: kernel.gated_delta_tree(q, k, v, g, beta, None, s0, False))
    same = add("recurrence", "chain 16", "chain, same kernel", lambda: kernel.gated_delta_tree(q, k, v, g, beta, chain_par, s0, True))
    print("\nrecurrence (us, median)             eager    graph   tree/chain kernel  tree/chain same kernel  reference/tree")
    print(f"  {'chain kernel (all states)':<30} {base['eager_us']:8.1f} {base['graph_us']:8.1f}")
    print(f"  {'chain kernel (last state)':<30} {last['eager_us']:8.1f} {last['graph_us']:8.1f}")
    print(f"  {'chain 16 through tree path':<30} {same['eager_us']:8.1f} {same['graph_us']:8.1f}")
    for shape, parents in SHAPES.items():
        par = torch.tensor(parents, dtype=torch.int32, device=device)
        tree = add("recurrence", shape, "tree", lambda par=par: kernel.gated_delta_tree(q, k, v, g, beta, par, s0, True))
        ref = add(
            "recurrence", shape, "reference",
            lambda parents=parents: reference.gated_delta_tree(q, k, v, g, beta, parents, s0, True), graph=False,
        )
        tree["ratio_vs_chain_kernel"] = {m: tree[m] / base[m] for m in ("eager_us", "graph_us")}
        tree["ratio_vs_chain_same_kernel"] = {m: tree[m] / same[m] for m in ("eager_us", "graph_us")}
        tree["speedup_vs_reference_eager"] = ref["eager_us"] / tree["eager_us"]
        print(
            f"  tree {shape:<25} {tree['eager_us']:8.1f} {tree['graph_us']:8.1f}"
            f"   {tree['ratio_vs_chain_kernel']['eager_us']:5.2f} / {tree['ratio_vs_chain_kernel']['graph_us']:5.2f}"
            f"        {tree['ratio_vs_chain_same_kernel']['eager_us']:5.2f} / {tree['ratio_vs_chain_same_kernel']['graph_us']:5.2f}"
            f"          {tree['speedup_vs_reference_eager']:6.1f}x  (reference {ref['eager_us']:.0f} us)"
        )

    # Launch shape sweep on a random tree and the chain (the defaults are block_v 16, 2 warps).
    print("\nrecurrence sweep (graph us): tree random 16 (a) vs chain kernel")
    sweep_par = torch.tensor(SHAPES["random 16 (a)"], dtype=torch.int32, device=device)
    for bv in (16, 32, 64):
        for warps in (1, 2, 4, 8):
            tree = add(
                "sweep", "random 16 (a)", f"tree bv{bv} w{warps}",
                lambda bv=bv, warps=warps: kernel.gated_delta_tree(
                    q, k, v, g, beta, sweep_par, s0, True, block_v=bv, num_warps=warps),
            )["graph_us"]
            chain = add(
                "sweep", "chain 16", f"chain kernel bv{bv} w{warps}",
                lambda bv=bv, warps=warps: kernel.gated_delta_tree(
                    q, k, v, g, beta, None, s0, True, block_v=bv, num_warps=warps),
            )["graph_us"]
            print(f"  bv {bv:3d} warps {warps}: tree {tree:6.1f}  chain {chain:6.1f}  ratio {tree / chain:5.2f}")

    # ---- conv ----
    cbase = add("conv", "chain 16", "chain kernel", lambda: kernel.tree_causal_conv(x, window, weight, bias, None))
    print("\nconv (us, median)                  eager    graph   tree/chain kernel  reference/tree")
    print(f"  {'chain kernel':<30} {cbase['eager_us']:8.1f} {cbase['graph_us']:8.1f}")
    for shape, parents in SHAPES.items():
        index = conv_window_index(parents, KSIZE).to(device)
        tree = add("conv", shape, "tree", lambda index=index: kernel.tree_causal_conv(x, window, weight, bias, index))
        ref = add("conv", shape, "reference", lambda index=index: reference.tree_causal_conv(x, window, weight, bias, index))
        tree["ratio_vs_chain_kernel"] = {m: tree[m] / cbase[m] for m in ("eager_us", "graph_us")}
        tree["speedup_vs_reference"] = {m: ref[m] / tree[m] for m in ("eager_us", "graph_us")}
        print(
            f"  tree {shape:<25} {tree['eager_us']:8.1f} {tree['graph_us']:8.1f}"
            f"   {tree['ratio_vs_chain_kernel']['eager_us']:5.2f} / {tree['ratio_vs_chain_kernel']['graph_us']:5.2f}"
            f"       {tree['speedup_vs_reference']['eager_us']:5.1f}x / {tree['speedup_vs_reference']['graph_us']:5.1f}x"
        )

    # ---- commit ----
    parents = SHAPES["random 16 (a)"]
    index = conv_window_index(parents, KSIZE).to(device)
    _, states = kernel.gated_delta_tree(q, k, v, g, beta, torch.tensor(parents, device=device), s0, True)
    node = torch.tensor([NODES - 1], device=device)
    slot, win = s0.clone(), window.clone()
    ck = add("commit", "random 16 (a)", "kernel", lambda: kernel.commit_gdn_state(states, node, slot, x, index, win))

    def torch_commit():
        # What TargetRunner.commit does today per layer, with the node index kept on the device.
        # (index_select keeps the node on the device: no host sync, capturable.)
        buf = torch.cat([win, x])
        win.copy_(buf.index_select(0, index.index_select(0, node)[0, 1:]))
        slot.copy_(states.index_select(0, node)[0])

    cr = add("commit", "random 16 (a)", "reference (torch gather)", torch_commit)
    print(f"\ncommit (us): kernel {ck['eager_us']:.1f} / {ck['graph_us']:.1f} graph;"
          f" torch gather {cr['eager_us']:.1f} / {cr['graph_us']:.1f} graph")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bench_gdn_tree_{time.strftime('%Y%m%d_%H%M%S')}.json"
    path.write_text(json.dumps({"info": info, "rows": rows}, indent=2))
    print(f"\nraw: {path}")


if __name__ == "__main__":
    main()
