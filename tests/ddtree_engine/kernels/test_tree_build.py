"""The tree-build kernels (kernels/tree_build/kernel.py, serial; levels.py, level by level; threshold.py, by a bound
of the budget-th best score) against their
reference, and the reference against core.tree.build_tree: identical arrays (tokens, parents, depths,
ranks, scores bit for bit, num_nodes) on every tree shape (chain, star, full k-ary, random, depth 1,
budget 0, exhausted candidates, ties, zero-probability tokens, spine reservation). Interpreter on a CPU
host; natively, plus real budgets, on a GPU."""

from __future__ import annotations

import pytest
import torch

from sm90_compile import compile_in_shards
from ddtree_engine.core.tree import build_tree
from ddtree_engine.kernels.topk_logprobs import reference as topk_reference
from ddtree_engine.kernels.tree_build import reference
from ddtree_engine.kernels.tree_mask import reference as mask_reference

pytest.importorskip("triton")  # tests/ddtree_engine/conftest.py set TRITON_INTERPRET without a GPU

from ddtree_engine.kernels.tree_build import kernel  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FIELDS = ("tokens", "parents", "depths", "ranks", "scores", "num_nodes")
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _randn(depths, vocab, seed, scale=2.0):
    return torch.randn(depths, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def _tied(depths, vocab, seed):
    return torch.randint(0, 3, (depths, vocab), generator=torch.Generator().manual_seed(seed)).float()


def _zero_prob(depths, vocab, seed):
    x = _randn(depths, vocab, seed)
    x[:, 2:] = float("-inf")  # two finite tokens per depth, K larger: -inf scores get chosen
    return x


# name: (logits [L, V], budget, topk, spine_depth)
CASES = {
    "chain (topk 1)": (_randn(6, 20, 0), 15, 1, 0),
    "star (depth 1)": (_randn(1, 20, 1), 8, 8, 0),
    "depth 1, budget below K": (_randn(1, 20, 2), 3, 8, 0),
    "full binary (all equal)": (torch.zeros(3, 9), 14, 2, 0),
    "full ternary (all equal)": (torch.zeros(3, 9), 39, 3, 0),
    "random b15 k8": (_randn(15, 64, 3), 15, 8, 0),
    "random b22 k4": (_randn(7, 33, 4), 22, 4, 0),
    "random b64 k8": (_randn(15, 50, 5), 64, 8, 0),
    "random b1": (_randn(4, 11, 6), 1, 3, 0),
    "ties b40": (_tied(5, 12, 7), 40, 5, 0),
    "ties across depths b30": (_tied(4, 6, 8).round(), 30, 3, 0),
    "exhausted (L2 K2 b15)": (_randn(2, 10, 9), 15, 2, 0),
    "zero-probability tokens": (_zero_prob(4, 12, 10), 30, 4, 0),
    "spine 3": (_randn(6, 20, 11), 12, 3, 3),
    "spine deeper than L": (_randn(4, 20, 12), 10, 3, 9),
    "spine = budget": (_randn(8, 20, 13), 5, 3, 5),
    "spine with ties": (_tied(5, 8, 14), 20, 4, 2),
    "peaked (near-certain depths)": (_randn(10, 40, 15, scale=12.0), 30, 6, 0),
}


def _kernel_arrays(vals, ids, budget, root, spine, method="serial"):
    out = kernel.build_tree_arrays(vals.to(DEVICE), ids.to(DEVICE), budget, torch.tensor([root], device=DEVICE), spine,
                                   method=method)
    return tuple(a.cpu() for a in out)


def _assert_same(name, got, want):
    for field, g, w in zip(FIELDS, got, want):
        if field == "scores":
            finite = torch.isfinite(w)
            diff = (g[finite] - w[finite]).abs().max().item() if finite.any() else 0.0
            assert torch.equal(g, w), f"{name}: scores differ, max abs diff {diff:.3e}"
        else:
            assert torch.equal(g, w), f"{name}: {field} differ:\n kernel    {g.tolist()}\n reference {w.tolist()}"


@pytest.mark.parametrize("name", list(CASES))
def test_reference_mirrors_core_build_tree(name):
    logits, budget, topk, spine = CASES[name]
    tree = build_tree(logits, budget, topk, root_token=5, spine_depth=spine)
    k = min(topk, budget, logits.shape[1])
    vals, ids = topk_reference.sorted_topk_logprobs(logits, k)
    arrays = reference.build_tree_arrays(vals, ids, budget, 5, spine)
    n = int(arrays[-1][0])
    assert n == tree.num_nodes, f"{name}: {n} nodes, core.tree has {tree.num_nodes}"
    for field, got in zip(FIELDS[:5], arrays[:5]):
        assert torch.equal(got[:n], getattr(tree, field)), f"{name}: {field} differ from core.tree.build_tree"


METHODS = ("serial", "levels", "threshold")  # kernel.build_tree_arrays' selections ("levels" and "threshold" build spines serially)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", list(CASES))
def test_kernel_matches_the_reference(name, method):
    logits, budget, topk, spine = CASES[name]
    k = min(topk, budget, logits.shape[1])
    vals, ids = topk_reference.sorted_topk_logprobs(logits, k)
    got = _kernel_arrays(vals, ids, budget, 5, spine, method)
    _assert_same(name, got, reference.build_tree_arrays(vals, ids, budget, 5, spine))


@pytest.mark.parametrize("name", list(CASES))
def test_the_int64_frontier_keys_on_every_shape(name):
    """The serial build packs its frontier keys in int32 where they fit (key_constants: every case here) and in
    int64 beyond (budget 1000 with K 16, say): the int64 layout on the same shapes."""
    logits, budget, topk, spine = CASES[name]
    k = min(topk, budget, logits.shape[1])
    vals, ids = topk_reference.sorted_topk_logprobs(logits, k)
    assert kernel.key_constants(budget, k) != kernel.INT64_KEYS
    got = kernel.build_tree_arrays(vals.to(DEVICE), ids.to(DEVICE), budget, torch.tensor([5], device=DEVICE), spine,
                                   num_warps=1, key_layout=kernel.INT64_KEYS)
    _assert_same(name, tuple(a.cpu() for a in got), reference.build_tree_arrays(vals, ids, budget, 5, spine))


def _serial_case(name: str, seed_base: int, budget_hi: int, topk_hi: int, vocab: int = 12, cases: dict = CASES):
    """(logits, budget, topk, spine) of a named case, or of "random N": L in [1, 16), budget in [1, budget_hi), topk in
    [1, topk_hi) drawn from seed seed_base + N, tied logits on odd N, spine N % 3."""
    if name in cases:
        return cases[name]
    seed = int(name.split()[1])
    g = torch.Generator().manual_seed(seed_base + seed)
    depths, budget, topk = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 16), (1, budget_hi), (1, topk_hi)))
    return (_tied if seed % 2 else _randn)(depths, vocab, seed), budget, topk, seed % 3


def _spy_launches(monkeypatch, *keys) -> list:
    """The keywords `keys` of every `_build_tree` launch from here on (one value, or a tuple of them), in a list."""
    launched, real = [], kernel._build_tree

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **kw):
                launched.append(kw[keys[0]] if len(keys) == 1 else tuple(kw[key] for key in keys))
                return real[grid](*a, **kw)
            return launch

    monkeypatch.setattr(kernel, "_build_tree", Spy())
    return launched


@pytest.mark.parametrize("layout", ["climb", "jumps"])
@pytest.mark.parametrize("name", list(CASES) + [f"random {seed}" for seed in range(6)])
def test_the_serial_layout_both_ways_on_every_shape(name, layout, monkeypatch):
    """The serial build's layout by a climb through the workspace and by pointer jumping in registers (`_build_tree`'s
    LJ, budgets to 64 on one warp here): the reference's arrays, and the launch took the way asked."""
    monkeypatch.setattr(kernel, "LAYOUT_JUMPS_UP_TO", 64 if layout == "jumps" else 0)
    logits, budget, topk, spine = _serial_case(name, 300, 64, 9)
    k = min(topk, budget, logits.shape[1])
    vals, ids = topk_reference.sorted_topk_logprobs(logits, k)
    launched = _spy_launches(monkeypatch, "LJ")
    got = kernel.build_tree_arrays(vals.to(DEVICE), ids.to(DEVICE), budget, torch.tensor([5], device=DEVICE), spine)
    assert (launched[0] > 0) == (layout == "jumps" and budget <= 64), launched
    _assert_same(f"{name} ({layout})", tuple(a.cpu() for a in got), reference.build_tree_arrays(vals, ids, budget, 5, spine))


# The serial build's ways to read the per-depth values and keep the nodes it chose (tree_build.kernel flags): a load a
# value and the workspace; the [L, K] values read once into registers, taken by a gather (`_select`'s TP); and the
# chosen nodes in registers too (its RC, where the layout jumps).
VALUE_WAYS = {"loads": (0, False), "table": (256, False), "table, chosen in registers": (256, True)}


@pytest.mark.parametrize("way", list(VALUE_WAYS))
@pytest.mark.parametrize("name", list(CASES) + [f"random {seed}" for seed in range(6)])
def test_the_serial_values_and_chosen_nodes_every_way_on_every_shape(name, way, monkeypatch):
    """The reference's arrays whichever way the pops read their values and keep their choices, and the launch took
    the way asked (the table where L * K fits it, the registers where the layout jumps: budgets to 32 here)."""
    table, regs = VALUE_WAYS[way]
    monkeypatch.setattr(kernel, "VALUE_TABLE_UP_TO", table)
    monkeypatch.setattr(kernel, "CHOSEN_IN_REGISTERS", regs)
    logits, budget, topk, spine = _serial_case(name, 500, 40, 17, vocab=20)
    k = min(topk, budget, logits.shape[1])
    vals, ids = topk_reference.sorted_topk_logprobs(logits, k)
    launched = _spy_launches(monkeypatch, "TP", "RC")
    got = kernel.build_tree_arrays(vals.to(DEVICE), ids.to(DEVICE), budget, torch.tensor([5], device=DEVICE), spine)
    fits = vals.numel() <= table
    assert launched == [(kernel.value_table(*vals.shape, 1) if fits else 0, regs and budget <= 32)], launched
    assert (launched[0][0] > 0) == fits
    _assert_same(f"{name} ({way})", tuple(a.cpu() for a in got), reference.build_tree_arrays(vals, ids, budget, 5, spine))


def test_the_values_table_up_to_128_on_one_warp():
    """The default (VALUE_TABLE_UP_TO, measured at L 15 with K 8): the table's size, L * K to a power of two, up to 128
    on one warp; loads past it and on more warps. The chosen nodes in registers and the compile in the build by
    default."""
    assert [kernel.value_table(15, k, 1) for k in (1, 8, 9, 16)] == [16, 128, 0, 0]
    assert kernel.value_table(15, 8, 4) == 0
    assert kernel.CHOSEN_IN_REGISTERS and kernel.COMPILE_IN_BUILD


def _dirty_compiled(n):
    """compile buffers full of wrong values (a reused step's), so a place the build leaves unwritten shows."""
    words = (n + 31) // 32
    return (torch.ones(n, n, dtype=torch.bool, device=DEVICE), torch.full((n, words), 7, dtype=torch.int32, device=DEVICE),
            *(torch.full((n,), 99, dtype=torch.int64, device=DEVICE) for _ in range(3)))


# Chains as deep as the jumps reach: 15 nodes at NB 16 (4 rounds), 16 spine nodes with budget 17 (NB 32, 5 rounds).
DEEP_CHAINS = {"chain 15 deep": (_randn(15, 20, 20), 15, 1, 0), "spine 16 deep, budget 17": (_randn(16, 20, 21), 17, 2, 16)}


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[1] <= 32] + list(DEEP_CHAINS)
                         + [f"random {seed}" for seed in range(8)])
def test_the_build_compiles_the_tree_itself_on_every_shape(name):
    """compiled= (`_build_compile_tree`: ancestors as bits by pointer jumping, links from the frontier slots; budgets
    to 32, so 33 rows and two packed words too): the reference's tree and the reference compile of it (mask, packed
    mask, positions, links), on buffers left dirty."""
    logits, budget, topk, spine = _serial_case(name, 400, 33, 9, cases={**CASES, **DEEP_CHAINS})
    budget = 32 if name == "random 0" else budget
    k = min(topk, budget, logits.shape[1])
    assert kernel.compiles_in_build(budget, k), (budget, k)
    vals, ids = topk_reference.sorted_topk_logprobs(logits, k)
    compiled = _dirty_compiled(budget + 1)
    got = kernel.build_tree_arrays(vals.to(DEVICE), ids.to(DEVICE), budget, torch.tensor([5], device=DEVICE), spine,
                                   compiled=compiled, prefix_len=torch.tensor([300], device=DEVICE))
    tree = reference.build_tree_arrays(vals, ids, budget, 5, spine)
    _assert_same(name, tuple(a.cpu() for a in got), tree)
    want = mask_reference.compile_tree_arrays(tree[1], tree[2], int(tree[5][0]), 300)
    for field, g, w in zip(("mask", "packed", "positions", "first_child", "next_sibling"), compiled, want):
        assert torch.equal(g.cpu(), w), f"{name}: {field}\n kernel    {g.cpu().tolist()}\n reference {w.tolist()}"


def test_the_build_compiles_the_tree_itself_only_where_it_can():
    """compiled= where compiles_in_build says no (another method, more warps, past budget 32) or with buffers of
    another shape, or prefix_len alone: a ValueError naming what, before any launch."""
    vals, ids = topk_reference.sorted_topk_logprobs(_randn(6, 20, 1), 8)
    vals, ids, root, prefix = vals.to(DEVICE), ids.to(DEVICE), torch.tensor([5], device=DEVICE), torch.tensor([0], device=DEVICE)
    assert [kernel.compiles_in_build(b, 8) for b in (1, 15, 31, 32, 33, 200)] == [True, True, True, True, False, False]
    assert not kernel.compiles_in_build(15, 8, "levels") and not kernel.compiles_in_build(15, 0)
    for budget, extra, match in ((15, dict(method="levels"), "method 'levels'"), (15, dict(num_warps=4), "num_warps 4"),
                                 (33, {}, "budget 33")):
        with pytest.raises(ValueError, match=match):
            kernel.build_tree_arrays(vals, ids, budget, root, compiled=_dirty_compiled(budget + 1), prefix_len=prefix, **extra)
    with pytest.raises(ValueError, match="shaped"):
        kernel.build_tree_arrays(vals, ids, 15, root, compiled=_dirty_compiled(15), prefix_len=prefix)
    with pytest.raises(ValueError, match="prefix_len"):
        kernel.build_tree_arrays(vals, ids, 15, root, compiled=_dirty_compiled(16))
    with pytest.raises(ValueError, match="goes with compiled"):
        kernel.build_tree_arrays(vals, ids, 15, root, prefix_len=prefix)


def test_the_layout_jumps_up_to_nb_32_on_one_warp():
    """The default (LAYOUT_JUMPS_UP_TO, measured): log2(NB) rounds up to NB 32 on one warp (at least one), the climb
    past it and on more warps; the sm_90 compile test below covers both."""
    assert [kernel.layout_jumps(nb, 1) for nb in (1, 2, 16, 32, 64, 256)] == [1, 1, 4, 5, 0, 0]
    assert kernel.layout_jumps(16, 4) == 0


def test_the_key_layout_fits_its_fields():
    """int32 at the served budgets (K 8 up to 256 and beyond), int64 where a field would overflow 31 bits."""
    assert all(kernel.key_constants(b, 8)["KNONE"] == 2**31 - 1 for b in (1, 15, 22, 64, 256, 511))  # int32
    assert kernel.key_constants(1000, 16) == kernel.INT64_KEYS and kernel.key_constants(4095, 4095) == kernel.INT64_KEYS
    for budget, k in ((1, 1), (15, 8), (256, 8), (300, 16), (511, 8)):
        c = kernel.key_constants(budget, k)
        assert 1 << (budget - 1).bit_length() < 2 ** c["SC"] and 2 * budget + 1 < 2 ** (c["SR"] - c["SC"])
        assert k - 1 < 2 ** (c["SD"] - c["SR"]) and c["SD"] + 6 <= 31


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed", range(8))
def test_kernel_matches_the_reference_on_random_shapes(seed, method):
    g = torch.Generator().manual_seed(100 + seed)
    depths = int(torch.randint(1, 16, (1,), generator=g))
    budget = int(torch.randint(1, 80, (1,), generator=g))
    topk = int(torch.randint(1, 9, (1,), generator=g))
    spine = int(torch.randint(0, 4, (1,), generator=g)) * (seed % 2)
    logits = _tied(depths, 10, seed) if seed % 3 == 0 else _randn(depths, 10, seed)
    k = min(topk, budget, 10)
    vals, ids = topk_reference.sorted_topk_logprobs(logits, k)
    name = f"seed {seed}: L {depths} budget {budget} K {k} spine {spine}"
    _assert_same(name, _kernel_arrays(vals, ids, budget, 3, spine, method), reference.build_tree_arrays(vals, ids, budget, 3, spine))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("depths,k,budget,spine", [(6, 3, 40, 0), (8, 4, 60, 0), (15, 8, 64, 0), (5, 2, 24, 2), (5, 2, 27, 2), (4, 3, 4, 2),
                                                     (3, 4, 4, 2), (4, 5, 50, 3)])
def test_exact_ties_across_depths_ranks_and_parents(depths, k, budget, spine, method):
    """Integer log-probs (the same -1, -2, .. at every depth, or a step per depth) make sums equal exactly
    across depths, ranks and parents, so every pop is decided by the tie-break (shallower, lower rank,
    earlier proposal), e.g. a first pop's next sibling against a deeper runner-up of the same score:
    the case the build's second pop a reduction compares as scalars."""
    ids = torch.arange(depths * k).view(depths, k)
    ranks = -(torch.arange(k, dtype=torch.float64) + 1)
    for name, vals in {"same every depth": ranks.expand(depths, k).contiguous(),
                       "a step per depth": ranks + torch.arange(depths, dtype=torch.float64)[:, None] % 3 - 1}.items():
        want = reference.build_tree_arrays(vals, ids, budget, 4, spine)
        _assert_same(f"{name}: L {depths} K {k} budget {budget} spine {spine}",
                     _kernel_arrays(vals, ids, budget, 4, spine, method), want)


@pytest.mark.parametrize("budget,topk", [(15, 8), (256, 8), (256, 4), (100, 16)])
def test_levels_at_real_budgets(budget, topk):
    """The level-by-level selection at the budgets served and benchmarked, ties included (on the CPU
    too: its merges and binary searches are what differ from the serial heap), and on 6 random shapes
    up to budget 300 each."""
    depths = 15 if topk <= 8 else 14
    for name, logits in {"random": _randn(depths, 1000, budget), "ties": _tied(depths, 1000, budget)}.items():
        vals, ids = topk_reference.sorted_topk_logprobs(logits, topk)
        got = _kernel_arrays(vals, ids, budget, 11, 0, "levels")
        _assert_same(f"{name} b{budget} k{topk}", got, reference.build_tree_arrays(vals, ids, budget, 11, 0))
    for seed in range(6):
        g = torch.Generator().manual_seed(300 + budget + seed)
        depths, b = int(torch.randint(1, 16, (1,), generator=g)), int(torch.randint(1, 300, (1,), generator=g))
        k = min(int(torch.randint(1, 9, (1,), generator=g)), b)
        logits = _tied(depths, 40, seed) if seed % 2 == 0 else _randn(depths, 40, seed)
        vals, ids = topk_reference.sorted_topk_logprobs(logits, k)
        _assert_same(f"seed {seed}: L {depths} b {b} K {k}", _kernel_arrays(vals, ids, b, 3, 0, "levels"),
                     reference.build_tree_arrays(vals, ids, b, 3, 0))


def test_core_build_tree_on_the_kernels_equals_the_reference(monkeypatch):
    """Through core.tree.build_tree's dispatch: top-K kernel + build kernel (fp32 logits) give
    the reference's tree; scores within the top-K kernel's precision."""
    cases = [(CASES[n][0], *CASES[n][1:]) for n in ("random b15 k8", "ties b40", "spine 3", "star (depth 1)")]
    monkeypatch.setenv("DDTREE_KERNELS", "reference")
    want = [build_tree(x, b, t, 7, s) for x, b, t, s in cases]
    calls = []
    real = kernel.build_tree_arrays
    monkeypatch.setattr(kernel, "build_tree_arrays", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setenv("DDTREE_KERNELS", "triton")
    for (x, b, t, s), w in zip(cases, want):
        got = build_tree(x.to(DEVICE), b, t, 7, s)
        for field in FIELDS[:4]:
            assert torch.equal(getattr(got, field), getattr(w, field)), f"{field} differ"
        diff = (got.scores - w.scores).abs().max().item()
        assert diff < 1e-5, f"scores: max abs diff {diff:.3e}"
    assert len(calls) == len(cases)
    # Budget 0 and nothing drafted never reach the kernel.
    assert build_tree(torch.zeros(3, 5, device=DEVICE), 0, 4, 9).tokens.tolist() == [9]
    assert build_tree(torch.zeros(0, 5, device=DEVICE), 4, 4, 9).tokens.tolist() == [9]
    assert len(calls) == len(cases)


def test_bad_inputs_are_refused():
    vals, ids = torch.zeros(3, 2, dtype=torch.float64), torch.zeros(3, 2, dtype=torch.long)
    root = torch.tensor([1])
    with pytest.raises(ValueError, match="expected vals and ids"):
        kernel.build_tree_arrays(vals, ids[:, :1], 4, root)
    with pytest.raises(ValueError, match="expected float64 vals"):
        kernel.build_tree_arrays(vals.float(), ids, 4, root)
    with pytest.raises(ValueError, match="expected budget >= 1"):
        kernel.build_tree_arrays(vals, ids, 0, root)
    with pytest.raises(ValueError, match="expected method"):
        kernel.build_tree_arrays(vals, ids, 4, root, method="heap")
    with pytest.raises(ValueError, match="ceil"):
        kernel.build_tree_arrays(torch.zeros(15, 16, dtype=torch.float64), torch.zeros(15, 16, dtype=torch.long), 4, root)
    # A key layout other than the shape's own or the int64 one would overflow its fields or mix two layouts.
    for layout, method in ((kernel.key_constants(4, 2), "levels"), (kernel.INT64_KEYS, "levels"),
                           ({"SC": 2}, "serial"), (kernel.key_constants(300, 2), "serial")):
        with pytest.raises(ValueError, match="expected key_layout"):
            kernel.build_tree_arrays(vals, ids, 4, root, key_layout=layout, method=method)



def _threshold(vals, ids, budget):
    """method "threshold"'s arrays and whether it built them serially instead (fell_back)."""
    fell_back = torch.full((1,), -1, dtype=torch.int64, device=DEVICE)
    out = kernel.build_tree_arrays(vals.to(DEVICE), ids.to(DEVICE), budget, torch.tensor([3], device=DEVICE), 0,
                                   method="threshold", fell_back=fell_back)
    return tuple(a.cpu() for a in out), int(fell_back[0])


def _tie_at_cut(vals, budget):
    """(prefixes of the whole tree scoring exactly the budget-th best, how many of them the reference chose): a DFS
    pruned below that score (a child never beats its parent)."""
    rows = vals.double().tolist()
    chosen = reference.select_prefixes(rows, budget, 0)
    if len(chosen) < budget:
        return 0, 0
    t = min(c[3] for c in chosen)
    tied, stack = 0, [(0.0, 0)]
    while stack:
        score, d = stack.pop()
        for x in rows[d] if d < len(rows) else ():
            if score + x < t:
                break
            tied += score + x == t
            stack.append((score + x, d + 1))
    return tied, sum(1 for c in chosen if c[3] == t)


def _bf16(depths, vocab, seed):
    """Logits rounded to bf16, as a drafter gives them: equal log-probs are common (none in fp32)."""
    return (torch.randn(depths, vocab, generator=torch.Generator().manual_seed(seed)) * 3).bfloat16().float()


import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ddtree_engine.kernels.tree_build import threshold  # noqa: E402


@triton.jit
def _kth_kernel(x_ptr, ksel_ptr, out_ptr, N: tl.constexpr, ROUNDS: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, N))
    tl.store(out_ptr + tl.program_id(0), threshold._kth(x, tl.load(ksel_ptr + tl.program_id(0)), N, ROUNDS))


_INT64_MIN = -(2**63)


@pytest.mark.parametrize("seed", range(6))
def test_the_radix_select_gives_the_kth_largest_key_and_a_bound_when_cut_short(seed):
    """threshold._kth, the cut's select (the pool's budget-th best score) and the bounds' (cut short): exact with
    all its rounds on keys with duplicates, both signs, the extremes and pads (_MIN, below every key), for every
    KSEL; cut after 1 or 2 rounds, a key of x at most the exact one (a lower bound) and at least the smallest."""
    g = torch.Generator().manual_seed(seed)
    n, real = 64, 40 + seed
    spread = 2 ** (10 * seed + 10)
    x = torch.randint(-spread, spread, (real,), generator=g, dtype=torch.int64)
    x[: 6 + seed] = x[6 + seed : 12 + 2 * seed]  # duplicates (ties at many ranks)
    x[-2:] = torch.tensor([2**63 - 1, _INT64_MIN + 1]) if seed % 2 else x[-2:]
    x = torch.cat([x, torch.full((n - real,), _INT64_MIN, dtype=torch.int64)])[torch.randperm(n, generator=g)]
    ksel = torch.arange(1, n + 1, dtype=torch.int64)
    want = x.sort(descending=True).values[ksel - 1]
    for rounds in (16, 2, 1):
        out = torch.empty(n, dtype=torch.int64, device=DEVICE)
        _kth_kernel[(n,)](x.to(DEVICE), ksel.to(DEVICE), out, N=n, ROUNDS=rounds)
        got = out.cpu()
        if rounds == 16:
            assert torch.equal(got, want), f"seed {seed}: wrong k-th at KSEL {(got != want).nonzero().flatten().tolist()}"
        else:
            assert bool((got <= want).all()) and bool(torch.isin(got, x).all()), f"seed {seed}, {rounds} rounds: {got} {want}"


@pytest.mark.parametrize("seed,budget", [(24, 64), (25, 64), (22, 128), (27, 128), (36, 128)])
def test_threshold_cuts_a_tie_at_the_budget_by_the_heap_order(seed, budget):
    """bf16 logits put exact ties at the budget's boundary (here the budget splits each: 3-7 tied, 1-3 chosen).
    The threshold build orders the tied prefixes itself, as the heap does (shallower, lower rank, then the
    parents' order), and must not hand them to the serial build: both checked."""
    vals, ids = topk_reference.sorted_topk_logprobs(_bf16(15, 2000, seed), 8)
    tied, chosen = _tie_at_cut(vals, budget)
    assert tied > chosen >= 1, f"seed {seed} b{budget}: no tie split at the cut ({tied} tied, {chosen} chosen)"
    got, fell_back = _threshold(vals, ids, budget)
    _assert_same(f"seed {seed} b{budget}", got, reference.build_tree_arrays(vals, ids, budget, 3, 0))
    assert fell_back == 0, f"seed {seed} b{budget}: built serially, not by the threshold"


def test_threshold_cuts_a_pool_past_its_small_tile(monkeypatch):
    """The cut reads the pool in a SMALL tile when it fits (the usual pool: the budget and a few), else in the whole
    CAPT: both give the reference's trees. SMALL made 16 here, so the random draws and the split ties above take the
    wide branch."""
    constants = threshold.threshold_constants
    monkeypatch.setattr(threshold, "threshold_constants", lambda *a: dict(constants(*a), SMALL=16))
    for seed, budget in ((24, 64), (22, 128), (5, 40)):
        vals, ids = topk_reference.sorted_topk_logprobs(_bf16(15, 2000, seed), 8)
        got, fell_back = _threshold(vals, ids, budget)
        _assert_same(f"seed {seed} b{budget}", got, reference.build_tree_arrays(vals, ids, budget, 3, 0))
        assert fell_back == 0


@pytest.mark.parametrize("budget", [7, 8, 9])
def test_threshold_orders_ties_by_the_parents_scores_not_their_ranks(budget):
    """Four depth-2 prefixes (a, b, 0) tie at -1e17 only by rounding (1e17's ulp is 16); the heap proposes them in
    their parents' order, by score: (0, 1) at -3 before (1, 0) at -6, though rank 0 is lower than 1."""
    vals = torch.tensor([[-1.0, -5.0], [-1.0, -2.0], [-1e17, -2e17]], dtype=torch.float64)
    ids = torch.arange(6).view(3, 2)
    assert _tie_at_cut(vals, budget) == (4, budget - 6)
    got, fell_back = _threshold(vals, ids, budget)
    _assert_same(f"b{budget}", got, reference.build_tree_arrays(vals, ids, budget, 3, 0))
    assert fell_back == 0


def test_threshold_builds_serially_only_where_it_must():
    """Its own selection on random logits and on a tie the budget splits within its cap (L 2, K 4, all equal: 16
    tied, 6 chosen); the serial build (same launch) for a split tie past the cap (K 8: 64 tied, 32 chosen), for a
    level past its room (integer logits: hundreds tied in one level), for rows with a positive value (a child could
    beat its parent); the serial kernel for a spine and for a shape it does not take (K 256, L 7: a [8, 8, 256] start bound;
    K 128 with L 8 it takes). The reference's arrays every time."""
    random = topk_reference.sorted_topk_logprobs(_randn(15, 500, 41), 8)
    ties = topk_reference.sorted_topk_logprobs(_tied(15, 500, 42), 8)
    positive = (random[0] + torch.arange(15, dtype=torch.float64)[:, None] % 2 * 6.0, random[1])  # sorted rows still
    equal4 = (torch.full((2, 4), -1.0, dtype=torch.float64), torch.arange(8).view(2, 4))
    equal8 = (torch.full((2, 8), -1.0, dtype=torch.float64), torch.arange(16).view(2, 8))
    wide = topk_reference.sorted_topk_logprobs(_randn(8, 500, 43), 128)
    wider = topk_reference.sorted_topk_logprobs(_randn(7, 500, 44), 256)
    assert _tie_at_cut(ties[0], 128)[0] > 64 and (positive[0] > 0).any()
    assert _tie_at_cut(equal4[0], 10) == (16, 6) and _tie_at_cut(equal8[0], 40) == (64, 32)
    assert kernel.threshold_fits(16, 128, 8) and not kernel.threshold_fits(8, 256, 7) and kernel.supports(7, 256, 8)
    assert kernel.threshold_fits(256, 8, 15) and not kernel.threshold_fits(1024, 8, 15)
    for name, (vals, ids), budget, spine, serial in (
        ("random", random, 128, 0, 0), ("tie within the cap", equal4, 10, 0, 0), ("tie past the cap", equal8, 40, 0, 1),
        ("ties", ties, 128, 0, 1), ("positive", positive, 128, 0, 1), ("spine", random, 64, 3, 1), ("K 128", wide, 16, 0, 0),
        ("K 256", wider, 8, 0, 1),
    ):
        fell_back = torch.full((1,), -1, dtype=torch.int64, device=DEVICE)
        got = kernel.build_tree_arrays(vals.to(DEVICE), ids.to(DEVICE), budget, torch.tensor([3], device=DEVICE), spine,
                                       method="threshold", fell_back=fell_back)
        _assert_same(name, tuple(a.cpu() for a in got), reference.build_tree_arrays(vals, ids, budget, 3, spine))
        assert int(fell_back[0]) == serial, f"{name}: fell_back {int(fell_back[0])}, expected {serial}"
    with pytest.raises(ValueError, match="fell_back"):
        kernel.build_tree_arrays(random[0], random[1], 8, torch.tensor([3]), method="threshold",
                                 fell_back=torch.zeros(2, dtype=torch.int64))


@gpu
@needs_cuda
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("budget,topk", [(15, 8), (22, 8), (64, 8), (256, 8), (256, 4), (100, 16)])
def test_real_budgets_on_the_gpu(budget, topk, method):
    depths = 15 if topk <= 8 else 14
    for name, logits in {"random": _randn(depths, 1000, budget), "ties": _tied(depths, 1000, budget)}.items():
        vals, ids = topk_reference.sorted_topk_logprobs(logits, topk)
        got = _kernel_arrays(vals, ids, budget, 11, 0, method)
        _assert_same(f"{name} b{budget} k{topk}", got, reference.build_tree_arrays(vals, ids, budget, 11, 0))


COMPILE_FOR_SM90 = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ddtree_engine.kernels.tree_build import kernel as k

sig = {"vals_ptr": "*fp64", "ids_ptr": "*i64", "root_ptr": "*i64", "L": "i32", "spine": "i32", "ws_ptr": "*i64",
       "ws_score_ptr": "*fp64", "tok_ptr": "*i64", "par_ptr": "*i64", "dep_ptr": "*i64", "rank_ptr": "*i64",
       "score_ptr": "*fp64", "n_ptr": "*i64"}
for budget, topk in ((15, 8), (22, 8), (256, 8), (100, 16), (1000, 16)):
    for fn, levels, skip in ((k._build_tree, False, ()), (k._build_tree_levels, True, ("spine",))):
        if not mine():  # sm90_compile.SHARD_ARGS
            continue
        consts = dict(k.launch_constants(budget, topk, levels), GDC=True)  # as launched on the H200 (kernels/gdc.py)
        if not levels:  # the layout by jumps where the budget takes it (15: 4 rounds, 22: 5), else the climb; the values'
            # table and the chosen nodes in registers where they are launched so (L 15)
            consts["LJ"] = k.layout_jumps(consts["NB"], k.default_warps(budget))
            consts["TP"] = k.value_table(15, topk, k.default_warps(budget))
            consts["RC"] = consts["LJ"] > 0
        params = {n: t for n, t in sig.items() if n not in skip}
        src = ASTSource(fn=fn, signature={**params, **{c: "constexpr" for c in consts}}, constexprs=consts)
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": k.default_warps(budget)}).asm["ptx"]
        print(fn.__name__, budget, topk, ".target sm_90" in ptx and "griddepcontrol.wait" in ptx)
csig = dict(sig, prefix_ptr="*i64", mask_ptr="*i1", packed_ptr="*i32", pos_ptr="*i64", fc_ptr="*i64", ns_ptr="*i64")
for budget in (15, 32):  # the build that compiles the tree too (k.compiles_in_build), at both ends of its range
    if not mine():
        continue
    consts = dict(k.launch_constants(budget, 8, False), LJ=k.layout_jumps(triton.next_power_of_2(budget), 1), GDC=True,
                  TP=k.value_table(15, 8, 1), W=triton.cdiv(budget + 1, 32))
    src = ASTSource(fn=k._build_compile_tree, signature={**csig, **{c: "constexpr" for c in consts}}, constexprs=consts)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1}).asm["ptx"]
    print("_build_compile_tree", budget, 8, ".target sm_90" in ptx and "griddepcontrol.wait" in ptx)
from ddtree_engine.kernels.tree_build import threshold as th
tsig = dict(sig, tws_ptr="*i64", tws_score_ptr="*fp64", flag_ptr="*i64")
order = ("vals_ptr", "ids_ptr", "root_ptr", "L", "spine", "ws_ptr", "ws_score_ptr", "tws_ptr", "tws_score_ptr", "tok_ptr",
         "par_ptr", "dep_ptr", "rank_ptr", "score_ptr", "n_ptr", "flag_ptr")
for budget, topk in ((64, 8), (256, 8)):
    if not mine():
        continue
    consts = dict(k.launch_constants(budget, topk, False), **th.threshold_constants(budget, topk, 15), GDC=True)
    src = ASTSource(fn=th._build_tree_threshold, signature={**{n: tsig[n] for n in order}, **{c: "constexpr" for c in consts}},
                    constexprs=consts)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": k.THRESHOLD_WARPS}).asm["ptx"]
    print("_build_tree_threshold", budget, topk, ".target sm_90" in ptx and "griddepcontrol.wait" in ptx)
"""


def test_the_build_kernels_compile_for_the_h200_without_one():
    """The interpreter runs a kernel's Python, not Triton's compiler, so what only the compiler refuses (a
    loop-carried value changing type, say) would show first on a GPU; Triton compiles to sm_90 PTX with
    its own ptxas on any host. In a child process: the kernels here are the interpreter's. Compiled as the
    H200 launches them, with programmatic dependent launch (GDC: its wait is in the PTX). The 14 compiles are
    shared among a process per core (~100 s on one core with a cold Triton cache, as in CI)."""
    lines = compile_in_shards(COMPILE_FOR_SM90)
    for budget, topk in ((15, 8), (22, 8), (256, 8), (100, 16), (1000, 16)):
        for name in ("_build_tree", "_build_tree_levels"):
            assert f"{name} {budget} {topk} True" in lines
    assert "_build_tree_threshold 64 8 True" in lines and "_build_tree_threshold 256 8 True" in lines
    assert "_build_compile_tree 15 8 True" in lines and "_build_compile_tree 32 8 True" in lines


def test_the_default_warps_are_ones_the_gpu_test_covers():
    """1 warp at the budgets served today (15, 31, 64: no faster with more), 4 from 128 (2x at 256),
    and never a count the GPU test below does not check against the reference."""
    assert [kernel.default_warps(b) for b in (1, 15, 31, 64, 127)] == [1] * 5
    assert [kernel.default_warps(b) for b in (128, 256, 300, 4095)] == [4] * 4
    assert {kernel.default_warps(b) for b in range(1, 4096)} <= {1, 2, 4, 8}


@gpu
@needs_cuda
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("num_warps", [2, 4, 8])
def test_more_warps_give_the_same_trees_on_the_gpu(num_warps, method):
    """The build kernel's heap lives in a global workspace that one program's warps share: with more
    than one warp (measured faster at large budgets, bench_tree_step.py) every tree shape, random
    shapes and the real budgets must still give the reference's arrays (it takes 4 from budget 128,
    kernel.default_warps; passed on the H200 on 2026-12-01)."""
    def arrays(vals, ids, budget, root, spine):
        out = kernel.build_tree_arrays(vals.to(DEVICE), ids.to(DEVICE), budget, torch.tensor([root], device=DEVICE), spine,
                                       num_warps=num_warps, method=method)
        return tuple(a.cpu() for a in out)

    for name, (logits, budget, topk, spine) in CASES.items():
        k = min(topk, budget, logits.shape[1])
        vals, ids = topk_reference.sorted_topk_logprobs(logits, k)
        _assert_same(f"{name}, {num_warps} warps", arrays(vals, ids, budget, 5, spine),
                     reference.build_tree_arrays(vals, ids, budget, 5, spine))
    for seed in range(16):
        g = torch.Generator().manual_seed(300 + seed)
        depths, budget = int(torch.randint(1, 16, (1,), generator=g)), int(torch.randint(1, 300, (1,), generator=g))
        k = min(int(torch.randint(1, 9, (1,), generator=g)), budget)
        logits = _tied(depths, 40, seed) if seed % 3 == 0 else _randn(depths, 40, seed)
        vals, ids = topk_reference.sorted_topk_logprobs(logits, k)
        _assert_same(f"seed {seed}, {num_warps} warps", arrays(vals, ids, budget, 3, 0),
                     reference.build_tree_arrays(vals, ids, budget, 3, 0))
    for budget, topk in [(15, 8), (64, 8), (256, 8), (256, 4), (100, 16)]:
        depths = 15 if topk <= 8 else 14
        for name, logits in {"random": _randn(depths, 1000, budget), "ties": _tied(depths, 1000, budget)}.items():
            vals, ids = topk_reference.sorted_topk_logprobs(logits, topk)
            _assert_same(f"{name} b{budget} k{topk}, {num_warps} warps", arrays(vals, ids, budget, 11, 0),
                         reference.build_tree_arrays(vals, ids, budget, 11, 0))


def proposer_key(scores: dict[tuple[int, ...], float], path: tuple[int, ...]) -> tuple:
    """A node's place in the best-first order: (-score, depth, rank, then its proposer's key).

    The proposer is the elder sibling, or the parent for rank 0; `scores` holds every node of
    the proposer chain (rank paths, root excluded).
    """
    key: list = []
    while path:
        key += [-scores[path], len(path), path[-1]]
        path = path[:-1] + (path[-1] - 1,) if path[-1] > 0 else path[:-1]
    return tuple(key)


def _paths(chosen) -> list[tuple[int, ...]]:
    """select_prefixes' choice as rank paths, in selection order."""
    paths: list[tuple[int, ...]] = []
    for _, rank, parent, _ in chosen:
        paths.append((paths[parent] if parent >= 0 else ()) + (rank,))
    return paths


def _static_order(vals: list[list[float]], budget: int) -> list[tuple[int, ...]]:
    """Every rank path of the full tree, sorted by proposer_key, cut at budget."""
    scores: dict[tuple[int, ...], float] = {}
    level = [()]
    for row in vals:
        level = [p + (r,) for p in level for r in range(len(row))]
        for p in level:
            scores[p] = scores.get(p[:-1], 0.0) + row[p[-1]]
    return sorted(scores, key=lambda p: proposer_key(scores, p))[:budget]


@pytest.mark.parametrize("seed", range(300))
def test_best_first_selection_is_a_static_order_of_the_full_tree(seed):
    """Since every depth shares one top-K row, the best-first order is a fixed order of the full K-ary
    tree (no spine reservation), and `select_by_levels` finds its first `budget` nodes with one
    top-`budget` per level instead of `budget` serial pops. Heavy ties every other seed."""
    g = torch.Generator().manual_seed(seed)
    depths, k = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 5, (1,), generator=g))
    if seed % 2:
        pool = torch.tensor([0.0, -0.25, -0.5, -1.0, -1.5, -2.0, -3.0], dtype=torch.float64)
        vals = pool[torch.randint(0, len(pool), (depths, k), generator=g)]
    else:
        vals = -torch.rand(depths, k, generator=g, dtype=torch.float64) * 3
    vals = vals.sort(dim=1, descending=True).values.tolist()
    budget = int(torch.randint(1, sum(k ** (d + 1) for d in range(depths)) + 1, (1,), generator=g))
    paths = _paths(reference.select_prefixes(vals, budget, 0))
    assert paths == _static_order(vals, budget)
    assert paths == reference.select_by_levels(vals, budget)


@pytest.mark.parametrize(("budget", "tied"), [(15, False), (15, True), (64, True), (256, False), (256, True)])
def test_select_by_levels_at_real_budgets(budget, tied):
    """L = 15, K = 8 from real top-K log-probs (bf16-like ties: logits from a few values)."""
    logits = _tied(15, 64, budget) if tied else _randn(15, 64, budget)
    vals, _ = topk_reference.sorted_topk_logprobs(logits, 8)
    paths = _paths(reference.select_prefixes(vals.tolist(), budget, 0))
    assert paths == reference.select_by_levels(vals.tolist(), budget)
