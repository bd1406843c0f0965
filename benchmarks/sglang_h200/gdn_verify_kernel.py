"""SGLang's tree-verify gated-delta kernel: stock, with the parent reload skipped, and chain.

    SCRIPT=gdn_kernel bash benchmarks/sglang_h200/run.sh BUNDLE_DIR OUT_DIR '{}'

One process on the GPU, SGLang 0.5.23's own wrapper `fused_sigmoid_gating_delta_rule_update` with the
arguments its hybrid GDN backend passes at target verify (fp32 state pool and intermediate-state
buffer, bs 1, verify width 16 = budget 15 + the root). Per (heads, tree) it captures one CUDA graph
of LAYERS launches (a buffer and inputs per layer, as the model's GDN layers have) for each arm and
prints the replay time per launch and the ratio to the chain verify DFLASH runs (no tree) measured
in the same run, medians over ROUNDS rounds of REPLAYS replays, arms interleaved within a round.

Arms: `chain` (tree None: DFLASH's verify), `stock` (tree mode, SGLang's kernel: every node after
the first reloads its parent's state from the intermediate-state buffer), `patched` (SGLang's kernel
with that reload skipped when the parent is the node just processed, whose state is still in
registers: `patched_source` rewrites the one line; bit-identical with an fp32 buffer). Trees: a chain
in tree mode, trees `core.tree.build_tree` picks (budget 15, topk 8) from peaked and from flat draft
logits, depth-major (as DDTREE's verify rows are) and the same trees depth-first, and a star. Every
patched launch is checked bit for bit against the stock one (outputs and per-node states).

Measured 2026-12-02 (benchmarks/results/sglang_h200_2026-12-02.json, call14_gdn_verify_kernel_fbc8b25): tree
mode costs 1.07-1.09x the chain (+1.4 us a launch, ~35 us per 24-layer 4B step, whatever the tree),
and the patch is slower than stock on every tree, the chain included (1.12x the chain): the reload is
not where tree mode's time goes, so the plugin runs SGLang's kernel unpatched.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

import torch

from ddtree_engine.core.tree import build_tree

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from graph_timing import capture, time_graph  # noqa: E402

SGLANG_MODULE = "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent"
KERNEL_NAME = "fused_sigmoid_gating_delta_rule_update_kernel"
# The reload in SGLang 0.5.23's tree branch, with the lines that make it unique.
RELOAD = "                b_h = tl.load(cache_ptr, mask=mask_h, other=0).to(tl.float32)\n"
ANCHOR = (
    "                step_offset = parent_step_idx * HV * K * V\n"
    "                cache_ptr = (\n"
    "                    intermediate_states_buffer\n"
    "                    + cache_idx * cache_steps * HV * K * V\n"
    "                    + step_offset\n"
    "                    + i_hv * K * V\n"
    "                    + o_v[None, :] * K\n"
    "                    + o_k[:, None]\n"
    "                )\n"
) + RELOAD
SKIP = "                if parent_step_idx != step_idx - 1:\n    " + RELOAD


def patched_source(source: str, skip: str = SKIP) -> str:
    """SGLang's module source with the tree branch's reload replaced by `skip`."""
    if source.count(ANCHOR) != 1:
        raise RuntimeError(f"expected the tree-verify reload of {SGLANG_MODULE} once, found it {source.count(ANCHOR)} times")
    return source.replace(ANCHOR, ANCHOR.replace(RELOAD, skip))


def patched_kernel(module, skip: str = SKIP):
    """The kernel of `module`'s patched text, imported from a file (Triton's JIT reads the source back)."""
    text = patched_source(open(module.__file__, encoding="utf-8").read(), skip)
    name = "gdn_verify_patched_" + hashlib.sha256(text.encode()).hexdigest()[:16]
    if name not in sys.modules:
        path = os.path.join(tempfile.mkdtemp(prefix="gdn-verify-"), name + ".py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        spec = importlib.util.spec_from_file_location(name, path)
        patched = importlib.util.module_from_spec(spec)
        sys.modules[name] = patched
        spec.loader.exec_module(patched)
    return getattr(sys.modules[name], KERNEL_NAME)


def use(module, kernel) -> None:
    """SGLang's wrapper looks the kernel up by name at every call."""
    setattr(module, KERNEL_NAME, kernel)


LAYERS = int(os.environ.get("LAYERS", "24"))
ROUNDS = int(os.environ.get("ROUNDS", "7"))
REPLAYS = int(os.environ.get("REPLAYS", "50"))
WIDTH = 16
HEADS = {"4b (HV 32, H 16, 128)": (16, 32, 128), "27b (HV 48, H 16, 128)": (16, 48, 128)}


def depth_first(parents: list[int]) -> list[int]:
    """The same tree with rows in depth-first order, children in their index order (root first)."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents[1:], start=1):
        children.setdefault(parent, []).append(node)
    order, stack = [], [0]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(reversed(children.get(node, [])))
    where = {old: new for new, old in enumerate(order)}
    return [0] + [where[parents[old]] for old in order[1:]]


def trees() -> dict[str, list[int]]:
    g = torch.Generator().manual_seed(0)
    vocab, depths = 4096, WIDTH - 1
    flat = torch.randn(depths, vocab, generator=g)
    peaked = flat.clone()
    peaked[torch.arange(depths), torch.randint(vocab, (depths,), generator=g)] += 10.0
    out = {"chain": [0] + list(range(WIDTH - 1)), "star": [0] * WIDTH}
    for name, logits in (("peaked", peaked), ("flat", flat)):
        tree = build_tree(logits, WIDTH - 1, 8, root_token=1)
        parents = [0] + tree.parents[1:].tolist()
        assert len(parents) == WIDTH, (name, len(parents))
        out[f"{name} depth-major"] = parents
        out[f"{name} depth-first"] = depth_first(parents)
    return out


def reloads(parents: list[int]) -> int:
    return sum(1 for i in range(1, len(parents)) if parents[i] != i - 1)


class Layer:
    def __init__(self, h: int, hv: int, d: int, seed: int):
        g = torch.Generator(device="cuda").manual_seed(seed)
        r = lambda *s: torch.randn(*s, generator=g, device="cuda")  # noqa: E731
        self.q, self.k = r(1, WIDTH, h, d).bfloat16(), r(1, WIDTH, h, d).bfloat16()
        self.v = r(1, WIDTH, hv, d).bfloat16()
        self.a, self.b = r(WIDTH, hv).bfloat16(), r(WIDTH, hv).bfloat16()
        self.A_log, self.dt_bias = r(hv) * 0.5, r(hv)
        self.ssm = r(4, hv, d, d)
        self.buffer = torch.zeros(2, WIDTH, hv, d, d, device="cuda")
        self.out = None

    def run(self, module, parents):
        self.out = module.fused_sigmoid_gating_delta_rule_update(
            A_log=self.A_log, a=self.a, dt_bias=self.dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
            q=self.q, k=self.k, v=self.v, b=self.b,
            initial_state_source=self.ssm, initial_state_indices=ONE, cu_seqlens=QSL,
            use_qk_l2norm_in_kernel=True, is_kda=False, disable_state_update=True,
            intermediate_states_buffer=self.buffer, intermediate_state_indices=ONE, cache_steps=WIDTH,
            retrieve_parent_token=parents,
        )


def main(out_dir: str) -> int:
    global ONE, QSL
    module = importlib.import_module(SGLANG_MODULE)
    stock, skipping = getattr(module, KERNEL_NAME), patched_kernel(module)
    ONE = torch.ones(1, dtype=torch.int32, device="cuda")
    QSL = torch.tensor([0, WIDTH], dtype=torch.int32, device="cuda")
    shapes = trees()
    results, mismatches = [], []
    for heads_name, (h, hv, d) in HEADS.items():
        layers = [Layer(h, hv, d, seed) for seed in range(LAYERS)]
        use(module, stock)
        chain_graph = capture(layers, module, None)
        for tree_name, parents in shapes.items():
            p = torch.tensor([parents], dtype=torch.int64, device="cuda")
            use(module, stock)
            stock_graph = capture(layers, module, p)
            stock_state = [(x.out.clone(), x.buffer.clone()) for x in layers]
            use(module, skipping)
            patched_graph = capture(layers, module, p)
            for (o, b), x in zip(stock_state, layers):
                if not (torch.equal(o, x.out) and torch.equal(b, x.buffer)):
                    mismatches.append(f"{heads_name} {tree_name}")
                    break
            use(module, stock)
            arms = {"chain": chain_graph, "stock": stock_graph, "patched": patched_graph}
            rounds = {name: [] for name in arms}
            for _ in range(ROUNDS):
                for name, graph in arms.items():
                    rounds[name].append(time_graph(graph, REPLAYS, LAYERS))
            med = {name: statistics.median(v) for name, v in rounds.items()}
            row = {
                "heads": heads_name, "tree": tree_name, "parents": parents, "reloads_stock": WIDTH - 1,
                "reloads_patched": reloads(parents), "us_per_launch": med, "rounds_us": rounds,
                "stock_over_chain": med["stock"] / med["chain"], "patched_over_chain": med["patched"] / med["chain"],
                "saved_us_per_step_24_layers": (med["stock"] - med["patched"]) * 24,
            }
            results.append(row)
            print(
                f"{heads_name:24s} {tree_name:20s} reloads {WIDTH - 1:2d}->{row['reloads_patched']:2d}  "
                f"chain {med['chain']:6.2f}  stock {med['stock']:6.2f} ({row['stock_over_chain']:.3f}x)  "
                f"patched {med['patched']:6.2f} ({row['patched_over_chain']:.3f}x) us/launch; "
                f"saved {row['saved_us_per_step_24_layers']:.1f} us per 24-layer step",
                flush=True,
            )
    print("patched == stock bit for bit:", "yes" if not mismatches else f"NO: {mismatches}")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gdn_verify_kernel.json"), "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "device": torch.cuda.get_device_name(),
                   "layers": LAYERS, "rounds": ROUNDS, "replays": REPLAYS, "width": WIDTH,
                   "mismatches": mismatches, "results": results}, f, indent=1)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
