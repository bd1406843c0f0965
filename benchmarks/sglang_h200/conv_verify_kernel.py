"""SGLang's tree conv update against the engine's (kernels/tree_conv_update), and the chain conv DFLASH runs.

    SCRIPT=conv_kernel bash benchmarks/sglang_h200/run.sh BUNDLE_DIR OUT_DIR '{}'
    python3 benchmarks/sglang_h200/conv_verify_kernel.py OUT_DIR --smoke     (CPU, Triton's interpreter: runs, checks)

SGLang 0.5.23's `causal_conv1d_update` with the arguments its GDN backend passes at target verify (bf16
x as the backend's transposed view, the conv-state pool [lines, dim, K-1] with channels contiguous, the
intermediate windows [lines, rows, dim, K-1], bs 1). Per (conv dim, rows, tree) it captures one CUDA graph of
LAYERS launches for each arm and prints the replay time per launch and each arm's ratio to the chain,
medians over ROUNDS rounds of REPLAYS replays, arms interleaved within a round. Arms: `chain` (no links:
DFLASH's verify), `sglang` (SGLang's tree path, DDTREE's with DDTREE_SGLANG_TREE_CONV=0), `engine` (the kernel the
plugin routes the tree path to, every layer finding its parents: what it did before 2026-12-06), `once` (the plugin's
router with parents_once, as SGLang's GDN backend calls it, DDTREE_SGLANG_TREE_CONV on by default: the first layer
finds the parents, the others take them; sglang_plugin/tree_conv.py PARENTS_ONCE).
The layers share one set of links and one parent buffer, as in SGLang's verify forward. Every engine launch, and the
plugin's whole forward, is checked bit for bit against SGLang's (the outputs, the conv state, every row's window,
the parents). Rows 16 and 33 (budget 15 and 32); 129 (budget 128)
is compiled only with WIDE=1 (SGLang's kernel compiles ~90-170 s there; 257: ~8 min, not run).
Exit 1 on a mismatch.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time

import torch

from ddtree_engine.kernels.tree_mask.reference import compile_tree_arrays

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from graph_timing import capture, time_graph  # noqa: E402

LAYERS = int(os.environ.get("LAYERS", "24"))
ROUNDS = int(os.environ.get("ROUNDS", "7"))
REPLAYS = int(os.environ.get("REPLAYS", "50"))
# conv dim = 2 * key heads * key dim + value heads * value dim (Qwen3.5 4B-class: 16, 128, 32, 128; 27B: 48 value heads)
DIMS = {"4b (conv 8192)": 8192, "27b (conv 10240)": 10240}
WIDTH = 4


def links(parents: list[int]) -> tuple[list[int], list[int]]:
    """First-child / next-sibling rows of a tree with parents before children, as the plugin hands them to SGLang."""
    n = len(parents)
    _, _, _, first, sibling = compile_tree_arrays(torch.tensor(parents), torch.zeros(n, dtype=torch.long), n, 0)
    return first.tolist(), sibling.tolist()


def trees(rows: int) -> dict[str, list[int]]:
    """Trees of `rows` rows, parents before children: a chain, a random tree of fans up to 8 wide, a star."""
    rng = random.Random(rows)
    return {"chain": [-1] + list(range(rows - 1)),
            "topk-8-like": [-1] + [rng.randrange(max(0, i - 8), i) for i in range(1, rows)],
            "star": [-1] + [0] * (rows - 1)}


class Layer:
    def __init__(self, dim: int, rows: int, shared: dict, seed: int, device: str):
        g = torch.Generator(device=device).manual_seed(seed)
        r = lambda *s: torch.randn(*s, generator=g, device=device).bfloat16()  # noqa: E731
        dtype = torch.bfloat16 if device == "cuda" else torch.float32  # the interpreter rounds to bf16 wrongly
        self.x = r(1, rows, dim).to(dtype).transpose(1, 2)
        self.state = r(4, WIDTH - 1, dim).to(dtype).transpose(1, 2)
        self.weight, self.bias = r(dim, WIDTH).to(dtype), r(dim).to(dtype)
        self.windows = torch.zeros(4, rows, dim, WIDTH - 1, dtype=dtype, device=device)
        self.first, self.sibling, self.parents = shared["first"], shared["sibling"], shared["parents"]
        self.layer_id = seed
        self.line = torch.tensor([2], dtype=torch.int32, device=device)
        self.out = None

    def run(self, fn, tree: bool):
        links = dict(retrieve_next_token=self.first, retrieve_next_sibling=self.sibling,
                     retrieve_parent_token=self.parents) if tree else {}
        call = lambda backend, layer: fn(self.x, self.state, self.weight, self.bias, "silu",  # noqa: E731
                                         conv_state_indices=self.line, intermediate_conv_window=self.windows,
                                         intermediate_state_indices=self.line, **links)
        if getattr(fn, "original", None) is not None:  # the plugin's router: inside GDNAttnBackend.forward_extend
            from ddtree_engine.sglang_plugin.tree_conv import layer_scope

            call = layer_scope(call)
        self.out = call(None, self)

    def arrays(self):
        return [a.clone() for a in (self.out, self.state, self.windows, self.parents)]


def engine_update(x, conv_state, weight, bias, activation, **kw):
    from ddtree_engine.kernels.tree_conv_update.kernel import tree_conv_update

    return tree_conv_update(x, conv_state, weight, bias, activation == "silu", kw["conv_state_indices"],
                            kw["intermediate_conv_window"], kw["intermediate_state_indices"], kw["retrieve_next_token"],
                            kw["retrieve_next_sibling"], kw["retrieve_parent_token"],
                            pdl=x.is_cuda and torch.cuda.get_device_capability()[0] >= 9)


def same_arrays(layers, sglang, engine) -> bool:
    """One forward of each over the layers from the same inputs: SGLang's arrays and the engine's, layer by layer."""
    saved = [(layer.state.clone(), layer.windows.clone()) for layer in layers]
    layers[0].parents.fill_(-7)
    theirs = []
    for layer in layers:
        layer.run(sglang, tree=True)
        theirs.append(layer.arrays())
    for layer, (state, windows) in zip(layers, saved):
        layer.state.copy_(state), layer.windows.copy_(windows)
    layers[0].parents.fill_(-7)  # so that parents the engine did not write cannot pass for SGLang's
    for layer, arrays in zip(layers, theirs):
        layer.run(engine, tree=True)
        if not all(torch.equal(a, b) for a, b in zip(layer.arrays(), arrays)):
            return False
    return True


def main(out_dir: str, smoke: bool = False) -> int:
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update as sglang

    from ddtree_engine.sglang_plugin.tree_conv import router

    device = "cpu" if smoke else "cuda"
    dims = {"smoke (conv 40)": 40} if smoke else DIMS
    widths = [5, 17] if smoke else [16, 33] + ([129] if os.environ.get("WIDE") == "1" else [])
    layers_n = 2 if smoke else LAYERS
    results, mismatches = [], []
    for dim_name, dim in dims.items():
        for rows in widths:
            for tree_name, parents in trees(rows).items():
                first, sibling = links(parents)
                shared = {"first": torch.tensor([first], device=device), "sibling": torch.tensor([sibling], device=device),
                          "parents": torch.full((1, rows), -7, dtype=torch.long, device=device)}
                layers = [Layer(dim, rows, shared, seed, device) for seed in range(layers_n)]
                plugin = router(sglang, parents_once=True)
                for name, engine in (("engine", engine_update), ("once", plugin)):
                    if not same_arrays(layers, sglang, engine):
                        mismatches.append(f"{dim_name} rows {rows} {tree_name} {name}")
                if plugin.given_calls != layers_n - 1:
                    mismatches.append(f"{dim_name} rows {rows} {tree_name}: the router took the parents given "
                                      f"{plugin.given_calls} times in {layers_n} layers")
                if smoke:
                    print(f"{dim_name} rows {rows} {tree_name}: checked", flush=True)
                    continue
                arms = {"chain": capture(layers, sglang, False), "sglang": capture(layers, sglang, True),
                        "engine": capture(layers, engine_update, True), "once": capture(layers, plugin, True)}
                rounds = {name: [] for name in arms}
                for _ in range(ROUNDS):
                    for name, graph in arms.items():
                        rounds[name].append(time_graph(graph, REPLAYS, layers_n))
                med = {name: statistics.median(v) for name, v in rounds.items()}
                row = {"dim": dim_name, "rows": rows, "tree": tree_name, "us_per_launch": med, "rounds_us": rounds,
                       "sglang_over_chain": med["sglang"] / med["chain"], "engine_over_chain": med["engine"] / med["chain"],
                       "engine_over_sglang": med["engine"] / med["sglang"], "once_over_chain": med["once"] / med["chain"],
                       "once_over_sglang": med["once"] / med["sglang"]}
                results.append(row)
                print(f"{dim_name:18s} rows {rows:3d} {tree_name:12s} chain {med['chain']:6.2f}  "
                      f"sglang {med['sglang']:6.2f} ({row['sglang_over_chain']:.2f}x)  engine {med['engine']:6.2f} "
                      f"({row['engine_over_chain']:.2f}x the chain, {row['engine_over_sglang']:.2f}x sglang)  once "
                      f"{med['once']:6.2f} ({row['once_over_chain']:.2f}x the chain, "
                      f"{row['once_over_sglang']:.2f}x sglang) us/launch",
                      flush=True)
    print("engine and once == sglang bit for bit:", "yes" if not mismatches else f"NO: {mismatches}")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "conv_verify_kernel.json"), "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d %H:%M"),
                   "device": "cpu (smoke)" if smoke else torch.cuda.get_device_name(),
                   "layers": layers_n, "rounds": ROUNDS, "replays": REPLAYS, "mismatches": mismatches,
                   "results": results}, f, indent=1)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], smoke="--smoke" in sys.argv[2:]))
