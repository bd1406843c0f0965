"""The DDTree step (top-K -> build -> compile -> walk) on the kernels vs today's path, measured in
one run on one GPU (issue 10, items 1-4).

Rows, over the same [L=15, V=151,936] bf16 draft logits:

- argmax: `logits.argmax(-1)`, what a DFLASH step spends on draft selection (the baseline);
- today: core.tree.build_tree + compile_tree (the references: a float64 sort of [L, V], a heap on
  the host) + the mask to the GPU;
- lean: torch.topk + logsumexp on the GPU, the tree-build reference (heap) on the host, the
  compile reference, the mask to the GPU;
- kernel eager: TreeStep.build + walk, launched from Python each time;
- kernel graph: the same captured once in a CUDA graph and replayed (what a serving loop runs).

Each budget's "PDL" and "plain launches" rows are its step with and without programmatic dependent launch
(kernels/gdc.py: pdl=True / False; the main row takes the default, DDTREE_PDL else on where the GPU can), and "fused PDL" the
one-launch build with it, measured in the same run; "64-bit keys" and "PDL 64-bit keys" the step whose top-K
first pass ranks 64-bit keys, as before 2026-12-05 (topk_logprobs.kernel.KEYS32 off; the stage table has that
pass + walk beside the default's); "rounds 1024/8/1w" and "PDL rounds 1024/8/1w" the step whose first pass
takes 1,024-token blocks, one warp, and selects by K rounds (TreeStep(topk_rounds=True, topk_block=1024, topk_warps=1)).
The argmax in a graph is one kernel into a static output (`torch.argmax(..., out=)`; before 2026-12-05 a
copy followed it).

Budgets 15 (topk 8), 22, 64, 256 (topk 8). Ratios printed: kernel graph / argmax (target <=
1.2), today / kernel graph (target >= 25x at b15, >= 40x at b256), and each against eager.

Then the step stage by stage: CUDA graphs that stop after the top-K's first pass, its merge, the build
and the compile, each ending with the walk (the first: what any step that reads the logits once and walks
in its own launch pays), against the argmax, and a graph replay alone. Then the top-K pass on its own (K = 8, same logits), eager and in a CUDA graph, by tokens per program,
tokens per group of its group stage (1: none) and warps (4096 / 8 / 4 is the default), against the argmax
and against the pass without the group stage, as ratios from this run. Then each stage alone per budget
(eager), and the compile in CUDA graphs by rows per program (1, 2, 4: the default, 16). Then the
build kernel at budgets 64 and 256 in a CUDA graph with 1, 2, 4 and 8 warps (it takes kernel.default_warps: 1 below budget 128, 4 from it), each checked against the 1-warp tree.
Each budget's row (TreeStep's default build: serial, threshold from budget 128) is followed by the same step
with the serial build and with the threshold build (TreeStep(build_method="threshold")), without the top-K's group stage (topk_group=1, the pass
before it), with the level-by-level build (TreeStep(build_method=
"levels")), with the one-launch build (TreeStep(fused=True): top-K, build and compile in one kernel)
and with both, each checked against the serial step and timed in a CUDA graph; last the build alone, serial against levels at 1, 4 and 8 warps, in CUDA graphs.

    python benchmarks/bench_tree_step.py [--quick] [--budgets 15,22] [--out DIR]   (JSON to DIR, else $OUT, else
    benchmarks/results/; --budgets: the main and stage tables' budgets, topk 8, default 15,22,64,256)

--quick: the main table with its serial, threshold, PDL, plain-launch, 64-bit-key, fused and rounds rows (no top-K
groups, levels and fused levels left out), then the stage table; nothing after it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "engine_patches" / "ddtree_engine" / "src"))

import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from ddtree_engine.core.tree import build_tree, compile_tree  # noqa: E402
from ddtree_engine.kernels.tree_build import reference as build_reference  # noqa: E402
from ddtree_engine.kernels.tree_mask import reference as mask_reference  # noqa: E402
from ddtree_engine.kernels.topk_logprobs import kernel as topk_kernel  # noqa: E402
from ddtree_engine.kernels.tree_step import TreeStep, reference_step  # noqa: E402

DEPTHS, VOCAB = 15, 151_936
BUDGETS = [(15, 8), (22, 8), (64, 8), (256, 8)]
TOPK_K = 8
# What this run found different from what it was checked against (each printed as MISMATCH where found); `_write`
# exits 1 after the JSON when it holds any.
MISMATCHES: list[str] = []
# (tokens per program, tokens per group, warps) of the top-K pass: first without the group stage, then the
# default (4096, 8, 4), then the neighbours.
TOPK_CONFIGS = [(4096, 1, 4), (4096, 8, 4), (4096, 4, 4), (4096, 16, 4), (4096, 32, 4), (2048, 8, 4), (8192, 8, 4),
                (8192, 16, 8), (4096, 8, 8), (2048, 8, 2), (1024, 8, 1), (2048, 16, 2), (8192, 32, 8)]


def _git_revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        return rev.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def today(logits: torch.Tensor, budget: int, topk: int) -> torch.Tensor:
    os.environ["DDTREE_KERNELS"] = "reference"
    try:
        compiled = compile_tree(build_tree(logits, budget, topk, root_token=1), 100)
    finally:
        os.environ.pop("DDTREE_KERNELS")
    return compiled.attention_mask.to(logits.device, non_blocking=False)


def lean(logits: torch.Tensor, budget: int, topk: int) -> torch.Tensor:
    k = min(topk, budget)
    top = torch.topk(logits.float(), k, dim=-1)
    logprobs = (top.values - torch.logsumexp(logits.float(), dim=-1, keepdim=True)).double().cpu()
    arrays = build_reference.build_tree_arrays(logprobs, top.indices.cpu(), budget, 1)
    n = int(arrays[-1][0])
    mask = mask_reference.compile_tree_arrays(arrays[1], arrays[2], n, 100)[0]
    return mask.to(logits.device)


def graphed(fn):
    """`fn` captured in a CUDA graph (run once on a side stream first: Triton compiles there)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def graphed_argmax(logits: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """The argmax over `logits`' last dimension in a CUDA graph: one kernel into a static output (no copy after it).
    Returns the graph and that output, which the caller keeps alive while the graph replays."""
    out = logits.argmax(dim=-1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.argmax(logits, dim=-1, out=out)
    return graph, out


def interleaved_rounds(graphs: dict, logits: torch.Tensor, rounds: int, name_width: int = 44, us_width: int = 6) -> None:
    """Time `graphs` (name: CUDA graph) and the graphed argmax over `logits` in `rounds` interleaved rounds (each
    round every graph's do_bench median, warm-up 10, rep 100 ms) and print each graph's median of its rounds, their
    spread and its ratio to the argmax's (the result scripts under benchmarks/results/)."""
    graphs = dict(graphs)
    graphs["argmax"], _out = graphed_argmax(logits)
    times = {name: [] for name in graphs}
    for _ in range(rounds):
        for name, g in graphs.items():
            times[name].append(do_bench(g.replay, warmup=10, rep=100, return_mode="median") * 1e3)
    med = {name: statistics.median(v) for name, v in times.items()}
    print(f"# {torch.cuda.get_device_name()}, medians of {rounds} interleaved rounds")
    for name, us in med.items():
        spread = max(times[name]) - min(times[name])
        print(f"{name:{name_width}s} {us:{us_width}.2f} us (rounds spread {spread:.2f})  {us / med['argmax']:.3f}x the graphed argmax")


@contextlib.contextmanager
def module_flags(flags: dict):
    """Module attributes ({(module, name): value}) set for the block and restored after it (the result scripts' arms,
    set around each capture: a graph keeps the launches its capture made)."""
    old = {key: getattr(*key) for key in flags}
    try:
        for (module, name), value in flags.items():
            setattr(module, name, value)
        yield
    finally:
        for (module, name), value in old.items():
            setattr(module, name, value)


def draws(depths: int, vocab: int, device) -> tuple[tuple[tuple[str, torch.Tensor], ...], torch.Tensor, torch.Tensor]:
    """The result scripts' two draws of bf16 logits [depths, vocab] from seed 0: "flat" (randn * 3) and "deep" (the
    same with token 7 lifted by 25 at every depth, one strong candidate a depth as a confident drafter's), with the root
    token 1 and the prefix length 100 as [1] tensors on `device`.

    Returns:
        ((("flat", logits), ("deep", logits)), root, prefix_len).
    """
    torch.manual_seed(0)
    flat = (torch.randn(depths, vocab, device=device) * 3).to(torch.bfloat16)
    deep = flat.clone()
    deep[:, 7] += 25
    return (("flat", flat), ("deep", deep)), torch.tensor([1], device=device), torch.tensor([100], device=device)


def first_children(step: TreeStep) -> torch.Tensor:
    """Each node's first child's token in `step`'s built tree (0 where none): target choices that walk it all the way
    down, on the step's device."""
    tok, par = step.tree[0].cpu().tolist(), step.tree[1].cpu().tolist()
    out = [0] * len(tok)
    for i in range(int(step.tree[5][0]) - 1, 0, -1):
        out[par[i]] = tok[i]
    return torch.tensor(out, device=step.device)


def arm_steps(logits: torch.Tensor, root, prefix, budget: int, arms: dict, keep: list, capture: bool,
              topk: int = 8) -> tuple[dict, dict]:
    """One TreeStep (`topk`, 8 unless given) per arm ({name: `module_flags`}, or {name: (`module_flags`, TreeStep
    keywords)}) at `budget`, each run once on `logits` with its flags set:
    build, then the walk with the target choosing each node's first child in the first arm's tree (`first_children`).
    With `capture` (a GPU) the steps launch with PDL and each run is captured too. `keep` holds what the graphs read.

    Returns:
        ({arm: step}, {arm: CUDA graph of that build and walk}, the second empty without `capture`).
    """
    depths, vocab = logits.shape
    steps, graphs, choices = {}, {}, None
    for arm, flags in arms.items():
        flags, kwargs = flags if isinstance(flags, tuple) else (flags, {})
        with module_flags(flags):  # a flag TreeStep reads when built (tree_build.kernel.compiles_in_build's bound)
            step = TreeStep(depths, vocab, budget, topk, logits.device, pdl=capture, **kwargs)
        keep.append(step)
        if choices is None:
            step.build(logits, root, prefix)
            choices = first_children(step)
            keep.append(choices)

        def whole(s=step, c=choices, flags=flags):
            with module_flags(flags):
                s.build(logits, root, prefix)
                s.walk(c)

        whole()
        steps[arm] = step
        if capture:
            graphs[arm] = graphed(whole)
    return steps, graphs


def compare_arms(arms: dict, budgets, base: str, depths: int, vocab: int, device, rounds: int, capture: bool,
                 name_width: int) -> None:
    """A result script's A/B on the flat draw (`draws`): each budget's arms (`arm_steps`, topk 8), their arrays against
    the `base` arm's (`report_arms`), then with `capture` (a GPU) the graphs timed in `rounds` interleaved rounds
    (`interleaved_rounds`, labels "b{budget} {arm}"). An arm whose arrays differ from the base's is not timed (a time
    for a wrong tree says nothing), and the script then exits 1 naming it, after the others are timed.

    Raises:
        SystemExit: 1, where any arm's arrays differ from the base arm's at any budget.
    """
    ((_, logits), _), root, prefix = draws(depths, vocab, device)
    graphs, keep, wrong = {}, [], []
    for budget in budgets:
        steps, step_graphs = arm_steps(logits, root, prefix, budget, arms, keep, capture=capture)
        bad = report_arms(f"b{budget}", steps, base)
        wrong += [f"b{budget} {arm}" for arm in bad]
        graphs.update({f"b{budget} {arm}": graph for arm, graph in step_graphs.items() if arm not in bad})
    if capture:
        interleaved_rounds(graphs, logits, rounds, name_width=name_width, us_width=7)
    if wrong:
        sys.exit(f"MISMATCH, not timed: {', '.join(wrong)} (arrays differ from the {base!r} arm's)")


def report_arms(label: str, steps: dict, base: str) -> list[str]:
    """Print each arm's step against the `base` arm's: tree (tokens, parents, depths, ranks), compiled and walked arrays
    equal or not, the log-probs' largest difference and the commit length.

    Returns:
        The arms whose arrays differ from the base arm's.
    """
    ref = steps[base]
    wrong = []
    for arm, step in steps.items():
        same = all(torch.equal(x, y) for x, y in zip(ref.tree[:4] + ref.compiled + ref.walked,
                                                     step.tree[:4] + step.compiled + step.walked))
        dv = (ref.vals - step.vals).abs().max().item()
        print(f"{label} {arm}: arrays {'same' if same else 'MISMATCH'}, log-probs within {dv:.1e}, "
              f"commit length {int(step.walked[2][0])}", flush=True)
        if not same:
            wrong.append(arm)
    return wrong


def floor_rows(logits: torch.Tensor, root, prefix, bench, argmax_us: float, argmax_graph_us: float,
               budgets=BUDGETS) -> list[dict]:
    """Where the graphed step's time goes, stage by stage: CUDA graphs that stop after each stage of
    TreeStep (serial build, default top-K), each ending with the walk, against the argmax.

    - replay: a one-element fill, what replaying any graph costs here;
    - first pass + walk: the top-K's first pass (`first_pass`: every block read once) and the walk,
      nothing between: what a step that reads the logits once and walks in its own launch pays;
    - + merge: the whole top-K; + build (its arrays only); + compile: the step as TreeStep runs it (up to budget 32
      the serial build compiles the tree in its own launch: tree_build.kernel.compiles_in_build).
    """
    rows = []
    fill = torch.empty(1, device=logits.device)
    replay_us = bench(graphed(lambda: fill.fill_(1.0)).replay)
    print(f"step by stage, CUDA graphs ending with the walk; a graph replay alone (one fill) {replay_us:.1f} us")
    print(f"{'budget':>6} {'stage':>24} {'graph us':>9} {'added us':>9} {'/argmax':>8} {'/graphed argmax':>15}")
    for budget, topk in budgets:
        step = TreeStep(DEPTHS, VOCAB, budget, topk, logits.device)
        step.build(logits, root, prefix)
        choices = torch.zeros(step.num_rows, dtype=torch.long, device=logits.device)
        first = topk_kernel.first_pass(logits, step.k, block=step.topk_block)
        walk = lambda s=step: s.walk(choices)  # noqa: E731
        topk = lambda s=step: s.topk_kernel.topk_logprobs(logits, s.k, out=(s.vals, s.ids), **s.topk_params)  # noqa: E731
        build = lambda s=step: s.build_kernel.build_tree_arrays(s.vals, s.ids, s.budget, root, 0, out=s.tree,  # noqa: E731
                                                                 method=s.build_method)
        def first_pass64(s=step):
            topk_kernel.KEYS32 = False
            try:
                topk_kernel.first_pass(logits, s.k, block=s.topk_block, out=first)
            finally:
                topk_kernel.KEYS32 = True

        stages = [
            ("first pass + walk", [lambda s=step: topk_kernel.first_pass(logits, s.k, block=s.topk_block, out=first), walk]),
            ("64-bit keys' pass + walk", [first_pass64, walk]),
            ("+ merge", [topk, walk]),
            ("+ build", [topk, build, walk]),
            ("+ compile (the step)", [lambda s=step: s.build(logits, root, prefix), walk]),
        ]
        before = replay_us
        for name, fns in stages:
            us = bench(graphed(lambda fns=fns: [fn() for fn in fns]).replay)
            row = {"budget": budget, "stage": name, "graph_us": us, "added_us": us - before, "replay_us": replay_us,
                   "over_argmax": us / argmax_us, "over_argmax_graph": us / argmax_graph_us}
            rows.append(row)
            print(f"{budget:>6} {name:>24} {us:>9.1f} {us - before:>9.1f} {row['over_argmax']:>8.2f} {row['over_argmax_graph']:>15.2f}")
            if not name.startswith("64"):  # the 64-bit row is beside the first, not a stage after it
                before = us
    return rows


def topk_rows(logits: torch.Tensor, bench, argmax_us: float, argmax_graph_us: float) -> list[dict]:
    """The top-K pass alone by (tokens per program, tokens per group, warps), eager and graphed; the
    first row is the pass without its group stage, the second what TreeStep runs."""
    want_vals, want_ids = topk_kernel.topk_logprobs(logits, TOPK_K)
    ref_vals, ref_ids = torch.topk(logits.float(), TOPK_K, dim=-1)  # no tie order: values only
    measured = {}
    for block, group, warps in TOPK_CONFIGS:
        out = (torch.empty_like(want_vals), torch.empty_like(want_ids))
        fn = lambda o=out, b=block, g=group, w=warps: topk_kernel.topk_logprobs(  # noqa: E731
            logits, TOPK_K, block=b, out=o, group=g, num_warps=w)
        vals, ids = fn()
        # Same ids bit for bit; log-probs within 1e-6 (the sums are grouped differently).
        same = torch.equal(ids, want_ids) and (vals - want_vals).abs().max().item() < 1e-6
        same = same and torch.equal(logits.float().gather(1, ids), ref_vals)
        measured[f"{block}/{group}/{warps}w"] = {"block": block, "group": group, "warps": warps, "eager_us": bench(fn),
                                                 "graph_us": bench(graphed(fn).replay), "same": same}
    rows = []
    print(f"top-K pass alone, [{DEPTHS}, {VOCAB}] bf16, K = {TOPK_K}, by tokens per program / per group / warps")
    print(f"{'kernel':>14} {'eager us':>9} {'graph us':>9} {'graph/argmax':>12} {'eager/argmax':>12} {'no groups/it':>12}")
    plain = measured[f"{TOPK_CONFIGS[0][0]}/1/{TOPK_CONFIGS[0][2]}w"]["graph_us"]
    for name, m in measured.items():
        row = {"kernel": name, **m, "graph_over_argmax_graph": m["graph_us"] / argmax_graph_us,
               "eager_over_argmax": m["eager_us"] / argmax_us, "no_groups_over_graph": plain / m["graph_us"]}  # fmt: skip
        rows.append(row)
        print(
            f"{name:>14} {m['eager_us']:>9.1f} {m['graph_us']:>9.1f} {row['graph_over_argmax_graph']:>12.2f} "
            f"{row['eager_over_argmax']:>12.2f} {row['no_groups_over_graph']:>11.2f}x"
            + ("" if m["same"] else "  MISMATCH vs the default / torch.topk")
        )
        if not m["same"]:
            MISMATCHES.append(f"top-K pass {name}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--rep", type=int, default=200, help="do_bench rep (ms) per measurement")
    parser.add_argument("--budgets", type=lambda v: [(int(b), 8) for b in v.split(",")], default=BUDGETS,
                        help="comma-separated budgets of the main and stage tables (topk 8; default 15,22,64,256)")
    parser.add_argument("--quick", action="store_true",
                        help="the main table (with and without PDL, serial, threshold, 64-bit keys, fused, rounds) and the stage "
                             "table only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    device = torch.device("cuda")
    info = {
        "gpu": torch.cuda.get_device_name(),
        "git": _git_revision(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "shape": [DEPTHS, VOCAB],
        "dtype": "bfloat16",
    }
    print(f"# {info['gpu']}  git {info['git']}  torch {info['torch']}  triton {info['triton']}")
    print(f"# draft logits [{DEPTHS}, {VOCAB}] bf16; median times (triton.testing.do_bench)")
    torch.manual_seed(0)
    logits = (torch.randn(DEPTHS, VOCAB, device=device) * 3).to(torch.bfloat16)
    root = torch.tensor([1], device=device)
    prefix = torch.tensor([100], device=device)
    bench = lambda fn, rep=args.rep: do_bench(fn, warmup=25, rep=rep, return_mode="median") * 1e3  # noqa: E731
    argmax_us = bench(lambda: logits.argmax(dim=-1))
    graph_argmax, _out_argmax = graphed_argmax(logits)
    argmax_graph_us = bench(graph_argmax.replay)
    print(f"argmax [L, V]: {argmax_us:.1f} us eager, {argmax_graph_us:.1f} us in a CUDA graph")
    rows = []
    header = f"{'budget':>6} {'topk':>4} {'today us':>10} {'lean us':>9} {'eager us':>9} {'graph us':>9} {'graph/argmax':>12} {'today/graph':>11} {'today/eager':>11} {'lean/graph':>10}"
    print(header)
    for budget, topk in args.budgets:
        step = TreeStep(DEPTHS, VOCAB, budget, topk, device)
        choices = torch.zeros(step.num_rows, dtype=torch.long, device=device)
        # Correctness first: the kernel step equals the reference step on these logits.
        step.build(logits, root, prefix)
        step.walk(choices)
        want_tree, want_compiled, _ = reference_step(logits, budget, topk, 1, 100, None)
        same = all(torch.equal(g.cpu(), w) for g, w in zip(step.tree[:4], want_tree[:4])) and torch.equal(
            step.compiled[0].cpu(), want_compiled[0]
        )

        def eager(step=step, choices=choices):
            step.build(logits, root, prefix)
            step.walk(choices)

        graph = graphed(eager)
        today_us = bench(lambda b=budget, t=topk: today(logits, b, t), rep=max(args.rep, 400))
        lean_us = bench(lambda b=budget, t=topk: lean(logits, b, t), rep=max(args.rep, 400))
        eager_us = bench(eager)
        graph_us = bench(graph.replay)
        row = {
            "budget": budget, "topk": topk, "matches_reference": same,
            "argmax_us": argmax_us, "argmax_graph_us": argmax_graph_us, "today_us": today_us, "lean_us": lean_us,
            "kernel_eager_us": eager_us, "kernel_graph_us": graph_us,
            "graph_over_argmax": graph_us / argmax_us, "today_over_graph": today_us / graph_us,
            "today_over_eager": today_us / eager_us, "lean_over_graph": lean_us / graph_us,
        }
        rows.append(row)
        print(
            f"{budget:>6} {topk:>4} {today_us:>10.1f} {lean_us:>9.1f} {eager_us:>9.1f} {graph_us:>9.1f} "
            f"{row['graph_over_argmax']:>12.2f} {row['today_over_graph']:>10.1f}x {row['today_over_eager']:>10.1f}x "
            f"{row['lean_over_graph']:>9.1f}x" + ("" if same else "  MISMATCH vs reference")
        )
        if not same:
            MISMATCHES.append(f"b{budget} step vs the reference")
        # The same step with the level-by-level build (tree_build kernel, method "levels") and with the
        # one-launch build (TreeStep(fused=True): top-K, build and compile in one kernel), each checked
        # against the serial step's arrays and timed in a CUDA graph.
        # "64-bit keys": the top-K's first pass ranking 64-bit keys, as before 2026-12-05 (topk_logprobs.kernel.KEYS32
        # off while the graph is captured: the graph keeps the kernel it launched).
        # "rounds 1024/8/1w": the first pass on 1,024-token blocks, one warp, its selections by K rounds
        # (TreeStep(topk_rounds=True); the fastest pass in benchmarks/results/firstpass_anatomy_20261205_h100.txt).
        rounds = dict(topk_block=1024, topk_warps=1, topk_rounds=True)
        variants = [("serial", dict(build_method="serial"), False), ("threshold", dict(build_method="threshold"), False),
                    ("PDL", dict(pdl=True), False), ("plain launches", dict(pdl=False), False),
                    ("64-bit keys", {}, True), ("PDL 64-bit keys", dict(pdl=True), True),
                    ("fused", dict(build_method="serial", fused=True), False),
                    ("fused PDL", dict(build_method="serial", fused=True, pdl=True), False),
                    ("rounds 1024/8/1w", dict(rounds, pdl=False), False), ("PDL rounds 1024/8/1w", dict(rounds, pdl=True), False),
                    ("no top-K groups", dict(build_method="serial", topk_group=1), False),
                    ("levels", dict(build_method="levels"), False),
                    ("fused levels", dict(build_method="levels", fused=True), False)]
        for name, kwargs, keys64 in variants[:10] if args.quick else variants:
            other = TreeStep(DEPTHS, VOCAB, budget, topk, device, **kwargs)

            def eager_other(step=other, choices=choices, keys64=keys64):
                topk_kernel.KEYS32 = not keys64
                try:
                    step.build(logits, root, prefix)
                    step.walk(choices)
                finally:
                    topk_kernel.KEYS32 = True

            eager_other()
            eager_other()  # twice: the fused build must find its counters at zero again
            matches = all(torch.equal(a, b) for a, b in zip(other.tree + other.compiled + other.walked,
                                                            step.tree + step.compiled + step.walked))
            us = bench(graphed(eager_other).replay)
            key = name.replace(" ", "_").replace("-", "").lower()
            row.update({f"{key}_matches_serial": matches, f"kernel_graph_{key}_us": us, f"graph_{key}_over_argmax": us / argmax_us,
                        f"today_over_graph_{key}": today_us / us})
            print(
                f"{'':>6} {'':>4} {name} build: graph {us:.1f} us, {us / argmax_us:.2f}x argmax "
                f"({us / argmax_graph_us:.2f}x the graphed argmax), today / graph {today_us / us:.1f}x, serial step / it "
                f"{graph_us / us:.2f}x" + ("" if matches else "  MISMATCH vs the serial step")
            )
            if not matches:
                MISMATCHES.append(f"b{budget} {name} build vs the serial step")
    floor_table = floor_rows(logits, root, prefix, bench, argmax_us, argmax_graph_us, args.budgets)
    if args.quick:
        _write(args.out, {"info": info, "rows": rows, "by_stage": floor_table})
        return
    topk_table = topk_rows(logits, bench, argmax_us, argmax_graph_us)
    # Where the kernel time goes at each budget (one stage at a time, eager launches, GPU time).
    stages = {}
    for budget, topk in BUDGETS:
        step = TreeStep(DEPTHS, VOCAB, budget, topk, device)
        k = step.k
        stages[budget] = {
            "topk_us": bench(lambda s=step, k=k: s.topk_kernel.topk_logprobs(logits, k, out=(s.vals, s.ids))),
            "build_us": bench(lambda s=step: s.build_kernel.build_tree_arrays(s.vals, s.ids, s.budget, root, 0, out=s.tree)),
            "compile_us": bench(
                lambda s=step: s.mask_kernel.compile_tree_arrays(s.tree[1], s.tree[2], s.tree[5], prefix, DEPTHS, out=s.compiled)
            ),
            "walk_us": bench(lambda s=step: s.walk_kernel.walk_arrays(s.tree[0], s.tree[1], s.tree[5], s.tree[0], DEPTHS, out=s.walked)),
        }
        # The compile by rows per program (4 is the default, 16 what the one-launch build compiles with), in CUDA graphs.
        for per_program in (1, 2, 4, 16):
            stages[budget][f"compile_{per_program}rows_graph_us"] = bench(graphed(
                lambda s=step, r=per_program: s.mask_kernel.compile_tree_arrays(s.tree[1], s.tree[2], s.tree[5], prefix, DEPTHS,
                                                                         out=s.compiled, rows_per_program=r)).replay)
        print(f"stages b{budget}: " + ", ".join(f"{name} {us:.1f} us" for name, us in stages[budget].items()))
    # The build is one program running `budget` serial pops; its warp count is a latency trade
    # (1 warp: no barriers, 8 slots per lane; more: fewer slots per lane, barriers per pop).
    build_warps = {}
    for budget, topk in BUDGETS[-2:]:
        step = TreeStep(DEPTHS, VOCAB, budget, topk, device)
        step.build(logits, root, prefix)
        want = [t.clone() for t in step.tree]
        build_warps[budget] = {}
        for warps in (1, 2, 4, 8):
            fn = lambda s=step, w=warps: s.build_kernel.build_tree_arrays(s.vals, s.ids, s.budget, root, 0, out=s.tree, num_warps=w)
            fn()
            same = all(torch.equal(got, exp) for got, exp in zip(step.tree, want))
            build_warps[budget][warps] = bench(graphed(fn).replay)
            if not same:
                print(f"  build b{budget} with {warps} warps: MISMATCH vs 1 warp")
                MISMATCHES.append(f"build b{budget} with {warps} warps vs 1 warp")
        print(f"build b{budget} in a CUDA graph by num_warps: " + ", ".join(f"{w}: {us:.1f} us" for w, us in build_warps[budget].items()))
    # The build alone, serial (default warps) against the level-by-level selection at 1, 4 and 8 warps,
    # each in a CUDA graph and checked against the serial tree, on this run's logits (a shallow tree: depth 3
    # at budget 256) and on peaked ones (one token per depth 20 logits up: nodes at all 15 depths at budget
    # 256), since the levels build skips the levels that cannot add a node.
    peaked = (logits.float() + 20.0 * torch.nn.functional.one_hot(
        torch.randint(0, VOCAB, (DEPTHS,), generator=torch.Generator().manual_seed(1)).to(device), VOCAB)).to(torch.bfloat16)
    build_levels = {}
    for kind, draft in (("random", logits), ("peaked", peaked)):
        for budget, topk in BUDGETS:
            step = TreeStep(DEPTHS, VOCAB, budget, topk, device)
            step.build(draft, root, prefix)
            want = [t.clone() for t in step.tree]
            n = int(step.tree[5][0])
            serial = lambda s=step: s.build_kernel.build_tree_arrays(s.vals, s.ids, s.budget, root, 0, out=s.tree)  # noqa: E731
            row = {"depth": int(step.tree[2][:n].max()), "serial": bench(graphed(serial).replay)}
            for warps in (1, 4, 8):
                fn = lambda s=step, w=warps: s.build_kernel.build_tree_arrays(  # noqa: E731
                    s.vals, s.ids, s.budget, root, 0, out=s.tree, num_warps=w, method="levels"
                )
                fn()
                if not all(torch.equal(got, exp) for got, exp in zip(step.tree, want)):
                    row[f"levels_{warps}w_mismatch"] = True
                    print(f"  levels build {kind} b{budget} with {warps} warps: MISMATCH vs the serial build")
                    MISMATCHES.append(f"levels build {kind} b{budget} with {warps} warps vs the serial build")
                row[f"levels_{warps}w"] = bench(graphed(fn).replay)
            build_levels[f"{kind} b{budget}"] = row
            best = min(row[f"levels_{w}w"] for w in (1, 4, 8))
            print(f"build {kind} b{budget} (depth {row['depth']}) in a CUDA graph: serial {row['serial']:.1f} us, levels "
                  + ", ".join(f"{w}w {row[f'levels_{w}w']:.1f}" for w in (1, 4, 8)) + f" us; serial / best levels {row['serial'] / best:.2f}x")
    _write(args.out, {"info": info, "rows": rows, "by_stage": floor_table, "topk": topk_table, "stages": stages,
                      "build_warps": build_warps, "build_levels": build_levels})


def _write(out_dir: str, result: dict) -> None:
    """Write the run's JSON, then exit 1 if any checked row differed from what it is checked against (`MISMATCHES`):
    the JSON keeps every row with its flag; the exit status tells a script or a person that a timing is of a wrong
    result."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bench_tree_step_{time.strftime('%Y%m%d_%H%M%S')}.json"
    result = {**result, "mismatches": list(MISMATCHES)}
    path.write_text(json.dumps(result, indent=2))
    print(f"# raw JSON: {path}")
    if MISMATCHES:
        sys.exit(f"MISMATCH in {len(MISMATCHES)} row(s): {'; '.join(MISMATCHES)}")


if __name__ == "__main__":
    main()
