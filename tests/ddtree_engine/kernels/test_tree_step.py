"""The whole DDTree step on the kernels (kernels/tree_step: top-K -> build -> compile -> walk,
fixed shapes, no host sync) against the references; on a GPU, captured in a CUDA graph and
replayed on new logits; and the reference engine, with every tree kernel in use, still emits
ar's tokens (T = 0, both architectures)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")  # tests/ddtree_engine/conftest.py set TRITON_INTERPRET without a GPU

from engine_oracle import ARCHES, OracleDrafter, rule_deep, rule_siblings, run  # noqa: E402
from sm90_compile import compile_in_shards  # noqa: E402
from step_graphs import capture_step  # noqa: E402

from ddtree_engine.kernels.topk_logprobs import kernel as topk_kernel  # noqa: E402
from ddtree_engine.kernels.topk_logprobs import reference as topk_reference  # noqa: E402
from ddtree_engine.kernels.tree_build import kernel as build_kernel  # noqa: E402
from ddtree_engine.kernels.tree_mask import kernel as mask_kernel  # noqa: E402
from ddtree_engine.kernels.tree_mask import reference as mask_reference  # noqa: E402
from ddtree_engine.kernels.tree_step import TreeStep, reference_step  # noqa: E402
from ddtree_engine.kernels.tree_walk import kernel as walk_kernel  # noqa: E402
from ddtree_engine.types import SpeculativeConfig  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
TREE = ("tokens", "parents", "depths", "ranks", "scores", "num_nodes")
COMPILED = ("mask", "packed", "positions", "first_child", "next_sibling")
WALKED = ("path", "emitted", "commit_len", "bonus")
# Build variants: the build kernel's selection, and "fused" for TreeStep's one-launch build.
METHODS = ["serial", "levels", "threshold", "fused serial", "fused levels"]


def _variant(method):
    """TreeStep's keyword arguments for one of METHODS."""
    return dict(build_method=method.split()[-1], fused="fused" in method)


def _logits(depths, vocab, seed, dtype=torch.float32, tied=False):
    g = torch.Generator().manual_seed(seed)
    if tied:
        return torch.randint(0, 3, (depths, vocab), generator=g).to(dtype)
    return (torch.randn(depths, vocab, generator=g) * 3).to(dtype)


def _deep_choices(tree, seed):
    """Target choices that follow a child where there is one (a random child, so the walk takes
    non-first siblings), from the reference tree."""
    tokens, parents, *_, num_nodes = tree
    n = int(num_nodes[0])
    g = torch.Generator().manual_seed(seed)
    choices = torch.full((tokens.shape[0],), 3, dtype=torch.long)
    for i in range(n):
        kids = [j for j in range(n) if int(parents[j]) == i]
        if kids:
            choices[i] = tokens[kids[int(torch.randint(len(kids), (1,), generator=g))]]
    return choices


def _compare(name, step, want):
    tree, compiled, walked = want
    for group, names, got_bufs, want_bufs in (
        ("tree", TREE, step.tree, tree),
        ("compiled", COMPILED, step.compiled, compiled),
        ("walked", WALKED, step.walked, walked),
    ):
        for field, g, w in zip(names, got_bufs, want_bufs):
            g = g.cpu()
            if field == "scores":
                finite = torch.isfinite(w)
                diff = (g[finite] - w[finite]).abs().max().item() if finite.any() else 0.0
                assert torch.equal(torch.isfinite(g), finite) and diff < 1e-5, f"{name}: scores, max abs diff {diff:.3e}"
            else:
                assert torch.equal(g, w), f"{name}: {group}.{field} differ:\n kernel    {g.tolist()}\n reference {w.tolist()}"


def _run_step(depths, vocab, budget, topk, spine, logits, root, prefix, seed, method="serial", block=4096, **options):
    want_tree, _, _ = reference_step(logits, budget, topk, root, prefix, None, spine)
    choices = _deep_choices(want_tree, seed)
    want = reference_step(logits, budget, topk, root, prefix, choices, spine)
    step = TreeStep(depths, vocab, budget, topk, DEVICE, spine, topk_block=block, **_variant(method), **options)
    step.build(logits.to(DEVICE), torch.tensor([root], device=DEVICE), torch.tensor([prefix], device=DEVICE))
    step.walk(choices.to(DEVICE))
    return step, want


STEPS = {  # name: (L, V, budget, topk, spine, tied)
    "b15 k8": (6, 300, 15, 8, 0, False),
    "b22 k4 ties": (7, 50, 22, 4, 0, True),
    "chain (topk 1)": (5, 40, 15, 1, 0, False),
    "depth 1": (1, 40, 6, 8, 0, False),
    "budget 0": (4, 40, 0, 8, 0, False),
    "spine 2": (6, 80, 12, 3, 2, False),
    "exhausted": (2, 20, 15, 2, 0, False),
}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", list(STEPS))
def test_step_matches_the_references(name, method):
    depths, vocab, budget, topk, spine, tied = STEPS[name]
    logits = _logits(depths, vocab, len(name), tied=tied)
    # 64-token blocks: several a row (the fused build's last-program merge has blocks to gather).
    step, want = _run_step(depths, vocab, budget, topk, spine, logits, 17, 40, len(name), method, block=64)
    _compare(name, step, want)
    if budget > 0 and topk > 1:
        assert int(step.walked[2][0]) >= 2, f"{name}: the walk accepted nothing"


def _nonfinite(depths, vocab, seed, dtype):
    """An overflowed drafter's logits: NaN tokens (row 0's best among them), +inf tokens, a NaN row at `depths - 2`."""
    x = _logits(depths, vocab, seed)
    x[0, 5::23] = float("nan")
    x[0, int(x[0].nan_to_num(nan=-1e9).argmax())] = float("nan")
    x[1, [4, 40]] = float("inf")
    x[depths - 2] = float("nan")
    return x.to(dtype)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape", ["b15 k4", "budget past the finite nodes"])
def test_non_finite_logits_give_the_references_tree(shape, method):
    """NaN logits count as -inf and +inf as the largest finite fp32 (topk_logprobs' note): every build gives the
    references' tree, its compile and walk, a tree of vocabulary ids; past a NaN row only -inf nodes are left,
    drafted when the budget reaches them."""
    # 6 depths, K 4: more finite prefixes than the budget. 4 depths, K 2: 6 finite ones above the NaN row (depth 3).
    depths, budget, topk = (6, 15, 4) if shape == "b15 k4" else (4, 15, 2)
    for dtype in (torch.float32, torch.bfloat16):
        logits = _nonfinite(depths, 300, 7, dtype)
        step, want = _run_step(depths, 300, budget, topk, 0, logits, 17, 40, 7, method, block=64)
        _compare(f"{shape} {dtype}", step, want)
        tokens, _, _, _, scores, num_nodes = (t.cpu() for t in step.tree)
        n = int(num_nodes[0])
        assert ((tokens[:n] >= 0) & (tokens[:n] < 300)).all() and not torch.isnan(scores[:n]).any()
        infinite = int(torch.isinf(scores[1:n]).sum())
        assert n == budget + 1 and infinite == (0 if shape == "b15 k4" else budget - 6), f"{infinite} -inf nodes"


def _random_case(rng):
    """One random step shape and its logits: ties (small integers) or not, NaN / +inf / -inf tokens and rows."""
    depths, vocab = rng.randint(1, 6), rng.choice([20, 64, 130, 300])
    budget, topk, method = rng.choice([1, 3, 8, 15, 22, 40]), rng.choice([1, 2, 3, 4, 8]), rng.choice(METHODS)
    spine = rng.choice([0, 0, 1, 2]) if method in ("serial", "threshold", "fused serial") else 0
    g = torch.Generator().manual_seed(rng.randrange(10**6))
    if rng.random() < 0.5:
        x = torch.randint(0, 3, (depths, vocab), generator=g).float()
    else:
        x = torch.randn(depths, vocab, generator=g) * rng.choice([0.5, 3.0, 30.0])
    for _ in range(rng.randint(0, 5)):
        r, t = rng.randrange(depths), rng.randrange(vocab)
        kind = rng.choice(["nan", "inf", "-inf", "nan row", "-inf row", "-inf tail"])
        if kind in ("nan", "inf", "-inf"):
            x[r, t] = float(kind)
        else:
            x[r, t if kind == "-inf tail" else 0:] = float("nan" if kind == "nan row" else "-inf")
    dtype = rng.choice([torch.float32, torch.bfloat16, torch.float16])
    return depths, vocab, budget, topk, spine, method, rng.choice([16, 64, 4096]), x.to(dtype)


@pytest.mark.parametrize("seed", range(4))
def test_random_steps_with_ties_and_non_finite_logits_match_the_references(seed):
    """Random shapes, builds and logits (ties, NaN, +inf, -inf): the top-K table is the float64 reference's
    (ids exact, log-probs within 1e-6) and the tree, compile and walk are the references' on that table bit for
    bit (on the float64 table itself, prefixes whose scores tie in exact arithmetic may order either way)."""
    import random

    rng = random.Random(seed)
    for case in range(10):
        depths, vocab, budget, topk, spine, method, block, x = _random_case(rng)
        name = f"seed {seed} case {case}: L {depths} V {vocab} budget {budget} topk {topk} spine {spine} {method} {x.dtype}"
        step = TreeStep(depths, vocab, budget, topk, DEVICE, spine, topk_block=block, **_variant(method))
        step.build(x.to(DEVICE), torch.tensor([17], device=DEVICE), torch.tensor([40], device=DEVICE))
        table = (step.vals.cpu(), step.ids.cpu())
        want_vals, want_ids = topk_reference.sorted_topk_logprobs(x, step.k)
        assert torch.equal(table[1], want_ids), f"{name}: top-K ids differ"
        finite = torch.isfinite(want_vals)
        assert torch.equal(torch.isfinite(table[0]), finite), f"{name}: -inf log-probs differ"
        assert not finite.any() or (table[0][finite] - want_vals[finite]).abs().max() < 1e-6, f"{name}: log-probs"
        tree, _, _ = reference_step(x, budget, topk, 17, 40, None, spine, topk_table=table)
        choices = _deep_choices(tree, case)
        step.walk(choices.to(DEVICE))
        _compare(name, step, reference_step(x, budget, topk, 17, 40, choices, spine, topk_table=table))


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="runs the CPU test engines through the interpreter; a GPU host runs the kernels natively above"
)
def test_engine_is_lossless_with_the_tree_kernels(engines, monkeypatch):
    """ddtree (deep and sibling acceptances) and dflash emit ar's tokens on both architectures
    with build, compile and walk on the kernels (the drafters' fp64 logits keep the top-K on its
    reference: that kernel takes fp32/bf16/fp16), and every compile on the way equals its reference (a 64-node tree
    among them: the compile's climb by gather)."""
    calls = {"build": 0, "compile": 0, "walk": 0}
    gathered, wrong = [], []
    real_rule = mask_kernel.climbs_by_gather
    monkeypatch.setattr(mask_kernel, "climbs_by_gather", lambda n: gathered.append(n) or real_rule(n))
    for name, module, fn in (
        ("build", build_kernel, "build_tree_arrays"),
        ("compile", mask_kernel, "compile_tree_arrays"),
        ("walk", walk_kernel, "walk_arrays"),
    ):
        real = getattr(module, fn)

        def counted(*a, _real=real, _name=name, **kw):
            calls[_name] += 1
            out = _real(*a, **kw)
            if _name == "compile":
                # The reference engine's verify builds its own mask from the parents and its walk reads only the
                # links, so the compiled mask is checked here, against the compile's reference, on every tree.
                parents, depths, num_nodes, prefix_len = a[:4]
                want = mask_reference.compile_tree_arrays(parents.cpu(), depths.cpu(), int(num_nodes.reshape(-1)[0]),
                                                          int(prefix_len.reshape(-1)[0]))
                wrong.extend(f"{parents.shape[0]} rows: {field}" for field, g, w in zip(COMPILED, out, want)
                             if not torch.equal(g.cpu(), w))
            return out

        monkeypatch.setattr(module, fn, counted)
    prompt, max_new = [60, 9, 200, 33, 101], 12
    for arch in ARCHES:
        engine = engines[arch]
        monkeypatch.setenv("DDTREE_KERNELS", "reference")
        truth = run(engine, prompt, SpeculativeConfig("ar"), max_new).token_ids
        monkeypatch.setenv("DDTREE_KERNELS", "triton")
        for case, spec, rule in (
            ("ddtree deep", SpeculativeConfig("ddtree", 15, 4), rule_deep),
            ("ddtree siblings", SpeculativeConfig("ddtree", 8, 3), rule_siblings),
            # 64 nodes: the compile climbs by gather (tree_mask.kernel.climbs_by_gather)
            ("ddtree wide", SpeculativeConfig("ddtree", 63, 4), rule_siblings),
            ("dflash", SpeculativeConfig("dflash"), rule_deep),
        ):
            drafter = OracleDrafter(prompt + truth, engine.runner.vocab_size, rule, seed=3)
            result = run(engine, prompt, spec, max_new, drafter=drafter)
            assert result.token_ids == truth, f"{arch} {case}"
            assert max(s.accepted_drafts for s in result.steps) >= 2, f"{arch} {case}: nothing deep was accepted"
    assert all(calls.values()), f"a kernel was never called: {calls}"
    assert any(real_rule(n) for n in gathered), f"no tree took the compile's gather: sizes {sorted(set(gathered))}"
    assert not wrong, f"compiled arrays differ from the reference: {wrong[:5]}"


@pytest.mark.parametrize("fused", [False, True])
def test_the_step_with_a_first_pass_by_rounds_on_one_warp(fused, monkeypatch):
    # TreeStep(topk_rounds=True, topk_warps=1): the first pass's selections by K rounds (what the anatomy timed
    # fastest), against `tl.topk` as the default here (`_TOPK` on, as on the GPU); the reference's arrays either way.
    import triton.language as tl

    monkeypatch.setattr(topk_kernel, "_TOPK", tl.constexpr(True))
    logits = _logits(5, 300, 7, torch.bfloat16)
    step, want = _run_step(5, 300, 15, 8, 0, logits, 3, 9, 7, "fused serial" if fused else "serial", block=64,
                           topk_rounds=True, topk_warps=1)
    assert step.topk_params["rounds"] and step.topk_params["num_warps"] == 1
    # One warp: the one-launch build builds and compiles from registers, as the build's own launch does.
    assert not fused or step.fused.shape.get("CIB")
    _compare("rounds, one warp", step, want)


def test_topk_kernel_in_the_step_is_used(monkeypatch):
    calls = []
    real = topk_kernel.topk_logprobs
    monkeypatch.setattr(topk_kernel, "topk_logprobs", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    step = TreeStep(3, 30, 5, 2, DEVICE)
    step.build(_logits(3, 30, 0).to(DEVICE), torch.tensor([1], device=DEVICE), torch.tensor([0], device=DEVICE))
    assert calls == [1]


@pytest.mark.parametrize("method,budget,in_build", [("serial", 15, True), ("serial", 32, True), ("serial", 33, False),
                                                    ("levels", 15, False), ("fused serial", 15, False)])
def test_the_serial_step_compiles_in_its_build_up_to_budget_32(method, budget, in_build, monkeypatch):
    """The serial build on one warp compiles the tree itself up to budget 32 (tree_build.kernel.compiles_in_build): no
    compile launch, and the step's arrays are the references'; past it and with the other builds, the compile kernel,
    once."""
    calls = []
    real = mask_kernel.compile_tree_arrays
    monkeypatch.setattr(mask_kernel, "compile_tree_arrays", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    logits = _logits(4, 60, budget)
    step, want = _run_step(4, 60, budget, 8, 0, logits, 17, 40, budget, method, block=64)
    assert step.compile_in_build == in_build and calls == ([] if in_build or "fused" in method else [1])
    _compare(f"{method} b{budget}", step, want)


@gpu
@needs_cuda
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("budget,topk", [(15, 8), (22, 8), (64, 8), (256, 8)])
def test_real_sizes_on_the_gpu(budget, topk, method):
    depths, vocab = 15, 151_936
    for seed, tied in ((1, False), (2, True)):
        logits = _logits(depths, vocab, seed, torch.bfloat16, tied)
        step, want = _run_step(depths, vocab, budget, topk, 0, logits, 42, 1000, seed, method)
        _compare(f"b{budget} k{topk} {'tied' if tied else 'random'}", step, want)


@gpu
@needs_cuda
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("budget,topk,spine", [(15, 8, 0), (64, 8, 2), (256, 8, 0)])
def test_the_step_replays_in_a_cuda_graph(budget, topk, spine, method):
    """Capture build + walk once; replay on new logits, root, prefix and choices copied into the
    static inputs; every replay equals the reference step on those inputs."""
    depths, vocab = 15, 151_936
    step = TreeStep(depths, vocab, budget, topk, "cuda", spine, **_variant(method))
    logits = torch.zeros(depths, vocab, dtype=torch.bfloat16, device="cuda")
    root = torch.zeros(1, dtype=torch.long, device="cuda")
    prefix = torch.zeros(1, dtype=torch.long, device="cuda")
    choices = torch.zeros(step.num_rows, dtype=torch.long, device="cuda")
    logits.copy_(_logits(depths, vocab, 0, torch.bfloat16).cuda())
    graph = capture_step(step, logits, root, prefix, choices)
    for seed in range(1, 5):
        new = _logits(depths, vocab, seed, torch.bfloat16, tied=seed % 2 == 0)
        logits.copy_(new.cuda())
        root.fill_(100 + seed)
        prefix.fill_(500 * seed)
        graph.replay()  # first with any choices: the tree does not depend on them
        torch.cuda.synchronize()
        # The top-K table against float64 (ids exact, log-probs within fp32-exp rounding) ...
        want_vals, want_ids = topk_reference.sorted_topk_logprobs(new, step.k)
        assert torch.equal(step.ids.cpu(), want_ids), f"replay {seed}: top-K ids differ"
        table_diff = (step.vals.cpu() - want_vals).abs().max().item()
        assert table_diff < 1e-6, f"replay {seed}: top-K log-probs, max abs diff {table_diff:.3e}"
        # ... and everything built from it bit for bit: bf16 logits tie prefixes in exact arithmetic,
        # which the ~1e-8 difference of the two tables may order either way (same tree quality).
        table = (step.vals.clone(), step.ids.clone())
        want_tree, _, _ = reference_step(new, budget, topk, 100 + seed, 500 * seed, None, spine, table)
        new_choices = _deep_choices(want_tree, seed)
        want = reference_step(new, budget, topk, 100 + seed, 500 * seed, new_choices, spine, table)
        choices.copy_(new_choices.cuda())
        graph.replay()
        torch.cuda.synchronize()
        _compare(f"replay {seed} b{budget}", step, want)
        assert int(step.walked[2][0]) >= 2


@pytest.mark.parametrize("method", ["fused serial", "fused levels"])
def test_the_fused_build_runs_again_on_new_logits(method):
    """The one-launch build leaves its counters at zero, so a second build (a graph replay) finds
    its last programs again and builds the new logits' tree, and it reads only its own launch's
    blocks: a step built on other logits first gives the same arrays as a fresh one."""
    depths, vocab, budget, topk = 5, 3000, 12, 4
    step = TreeStep(depths, vocab, budget, topk, DEVICE, topk_block=512, **_variant(method))
    assert step.fused.nchunk > 1, "the test needs several blocks a row"
    root, prefix = torch.tensor([7], device=DEVICE), torch.tensor([30], device=DEVICE)
    for seed in (5, 6, 7):
        logits = _logits(depths, vocab, seed)
        step.build(logits.to(DEVICE), root, prefix)
        assert not step.fused.counts.any(), f"seed {seed}: counters left at {step.fused.counts.tolist()}"
        want_tree, want_compiled, _ = reference_step(logits, budget, topk, 7, 30, None)
        for field, got, want in zip(TREE + COMPILED, step.tree + step.compiled, want_tree + want_compiled):
            if field != "scores":
                assert torch.equal(got.cpu(), want), f"seed {seed}: {field} differ"


def test_an_unknown_build_method_is_refused():
    with pytest.raises(ValueError, match="build_method"):
        TreeStep(3, 30, 5, 2, DEVICE, build_method="heap")
    with pytest.raises(ValueError, match="fused"):
        TreeStep(3, 30, 5, 2, DEVICE, build_method="threshold", fused=True)


def test_the_default_build_is_the_threshold_from_its_budget():
    """The threshold build from budget 128 (faster there on every draw measured, slower at 64 on most), the serial
    build under it, for the one-launch build, which does not take the threshold, and for shapes it does not take."""
    from ddtree_engine.kernels.tree_step import THRESHOLD_FROM_BUDGET

    assert THRESHOLD_FROM_BUDGET == 128
    assert TreeStep(15, 300, 128, 8, DEVICE).build_method == "threshold"
    assert TreeStep(15, 300, 256, 8, DEVICE).build_method == "threshold"
    assert TreeStep(15, 300, 127, 8, DEVICE).build_method == "serial"
    assert TreeStep(15, 300, 15, 8, DEVICE).build_method == "serial"
    assert TreeStep(15, 300, 256, 8, DEVICE, fused=True).build_method == "serial"
    assert TreeStep(5, 2000, 1024, 1024, DEVICE).build_method == "serial"  # a pool past threshold.MAX_VECTOR


COMPILE_FUSED_FOR_SM90 = r"""
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ddtree_engine.kernels.topk_logprobs import kernel as topk_kernel
from ddtree_engine.kernels.tree_build import kernel as build_kernel
from ddtree_engine.kernels.tree_mask import kernel as mask_kernel
from ddtree_engine.kernels.tree_step import kernel as k

i64, i32 = "*i64", "i32"
sig = {"logits_ptr": "*bf16", "stride_row": i32, "V": i32, "NCHUNK": i32, "keys_ptr": i64, "max_ptr": "*fp32",
       "sum_ptr": "*fp64", "count_ptr": "*i32", "vals_ptr": "*fp64", "ids_ptr": i64, "root_ptr": i64, "L": i32, "spine": i32,
       "ws_ptr": i64, "ws_score_ptr": "*fp64", "tok_ptr": i64, "par_ptr": i64, "dep_ptr": i64, "rank_ptr": i64,
       "score_ptr": "*fp64", "n_ptr": i64, "prefix_ptr": i64, "max_depth": i32, "mask_ptr": "*i1", "packed_ptr": "*i32",
       "pos_ptr": i64, "fc_ptr": i64, "ns_ptr": i64, "N": i32, "W": i32}
for budget, topk, levels in ((15, 8, False), (15, 8, True), (256, 8, True), (256, 8, False), (1000, 16, False)):
    if not mine():  # sm90_compile.SHARD_ARGS
        continue
    # The constants FusedBuild launches with at V = 151,936 (int32 frontier keys but at budget 1000).
    consts = {**topk_kernel.first_pass_constants(151_936, topk, 4096), **build_kernel.launch_constants(budget, topk, True),
              **build_kernel.key_constants(budget, topk), **mask_kernel.launch_constants(budget + 1, k.FUSED_COMPILE_ROWS), "LEVELS": levels,
              "LOWBITS": topk_kernel.key_low_bits(torch.bfloat16, 4096), "GDC": True,  # as launched on the H200 (kernels/gdc.py)
              "ROUNDS": levels,  # the first pass's selections by K rounds (TreeStep(topk_rounds=True)) in the levels cases
              "CIB": False, "LJ": 0, "TP": 0, "WC": 1}  # four warps: the build's own loads and workspace, then the compile's rows
    src = ASTSource(fn=k._fused_build, signature={**sig, **{c: "constexpr" for c in consts}}, constexprs=consts)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    print("fused", budget, topk, levels, ".target sm_90" in ptx and "griddepcontrol.wait" in ptx, "atom.global.gpu.acq_rel.add" in ptx)
# One warp, 1,024-token blocks by rounds: the build from registers with its compile (FusedBuild's CIB).
if mine():
    consts = {**topk_kernel.first_pass_constants(151_936, 8, 1024), **build_kernel.launch_constants(15, 8, True),
              **build_kernel.key_constants(15, 8), **mask_kernel.launch_constants(16, k.FUSED_COMPILE_ROWS), "LEVELS": False,
              "LOWBITS": topk_kernel.key_low_bits(torch.bfloat16, 1024), "GDC": True, "ROUNDS": True, "CIB": True,
              "LJ": build_kernel.layout_jumps(16, 1), "TP": build_kernel.value_table(15, 8, 1), "WC": 1}
    src = ASTSource(fn=k._fused_build, signature={**sig, **{c: "constexpr" for c in consts}}, constexprs=consts)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1}).asm["ptx"]
    print("fused one warp", ".target sm_90" in ptx and "griddepcontrol.wait" in ptx, "atom.global.gpu.acq_rel.add" in ptx)
"""


def test_the_fused_build_compiles_for_the_h200_without_one():
    """As test_tree_build's compile test: the one-launch build (both selections; on one warp the build from registers)
    compiles to sm_90 PTX with Triton's own ptxas, and its counters are acq_rel atomics (the ordering the last programs'
    reads of the other programs' blocks rely on). The 6 compiles shared among a process per core (sm90_compile)."""
    lines = compile_in_shards(COMPILE_FUSED_FOR_SM90, timeout_s=600)
    for budget, topk, levels in ((15, 8, False), (15, 8, True), (256, 8, True), (256, 8, False), (1000, 16, False)):
        assert f"fused {budget} {topk} {levels} True True" in lines, lines
    assert "fused one warp True True" in lines, lines
