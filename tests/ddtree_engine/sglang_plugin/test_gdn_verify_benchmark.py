"""benchmarks/sglang_h200/gdn_verify_kernel.py's patched kernel against SGLang's own, on the CPU.

The benchmark times SGLang's tree-verify gated-delta kernel with the parent reload skipped when the
parent is the node just processed (it turned out slower on the H200, so the plugin does not use it).
Its timings mean something only if the patched kernel computes what SGLang's does: here both run
under TRITON_INTERPRET (tests/ddtree_engine/conftest.py sets it before triton is imported) through
SGLang's own wrapper with the arguments its hybrid GDN backend passes at target verify (fp32 state
pool and intermediate-state buffer), and must agree bit for bit on every tree shape; a chain in tree
mode must equal SGLang's chain verify.
"""

from __future__ import annotations

import importlib
import random

import pytest
import torch
from repo_scripts import load_script

H, HV, K, V = 2, 4, 16, 16
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/sglang_h200/gdn_verify_kernel.py", "gdn_verify_kernel")


@pytest.fixture
def sglang_gdn(bench):
    module = importlib.import_module(bench.SGLANG_MODULE)
    stock = getattr(module, bench.KERNEL_NAME)
    yield module
    bench.use(module, stock)


def verify(module, parents, num_reqs: int, width: int, seed: int = 1):
    """One target-verify launch as SGLang's GDN backend makes it: (outputs, intermediate states)."""
    g = torch.Generator().manual_seed(seed)
    tokens = num_reqs * width
    x = {
        "q": torch.randn(1, tokens, H, K, generator=g),
        "k": torch.randn(1, tokens, H, K, generator=g),
        "v": torch.randn(1, tokens, HV, V, generator=g),
        "a": torch.randn(tokens, HV, generator=g),
        "b": torch.randn(tokens, HV, generator=g),
        "A_log": torch.randn(HV, generator=g) * 0.5,
        "dt_bias": torch.randn(HV, generator=g),
        "ssm": torch.randn(num_reqs + 2, HV, V, K, generator=g),
    }
    x = {name: t.to(DEVICE) for name, t in x.items()}
    ints = dict(dtype=torch.int32, device=DEVICE)
    buffer = torch.full((num_reqs + 1, width, HV, V, K), float("nan"), device=DEVICE)
    out = module.fused_sigmoid_gating_delta_rule_update(
        A_log=x["A_log"], a=x["a"], dt_bias=x["dt_bias"], softplus_beta=1.0, softplus_threshold=20.0,
        q=x["q"], k=x["k"], v=x["v"], b=x["b"],
        initial_state_source=x["ssm"], initial_state_indices=torch.arange(num_reqs, **ints) + 1,
        cu_seqlens=torch.arange(num_reqs + 1, **ints) * width, use_qk_l2norm_in_kernel=True, is_kda=False,
        disable_state_update=True, intermediate_states_buffer=buffer,
        intermediate_state_indices=torch.arange(num_reqs, **ints).flip(0) + 1, cache_steps=width,
        retrieve_parent_token=None if parents is None else torch.tensor(parents, dtype=torch.int64, device=DEVICE),
    )
    return out, buffer


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, the buffer's unwritten (NaN) cells included."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(torch.nan_to_num(a, nan=7.0), torch.nan_to_num(b, nan=7.0))


def _random_tree(width: int, rng: random.Random) -> list[int]:
    return [0] + [rng.randrange(i) for i in range(1, width)]


SHAPES = {
    "chain": [0] + list(range(8)),
    "star": [0] * 9,
    "binary": [0] + [(i - 1) // 2 for i in range(1, 9)],
    "spine with branches": [0] + [i - 1 if i % 4 else i - 3 for i in range(1, 9)],
    "random": _random_tree(9, random.Random(9)),
    "root only": [0],
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_patched_kernel_equals_sglangs_on_every_tree_shape(bench, sglang_gdn, shape):
    width = len(SHAPES[shape])
    trees = [SHAPES[shape], _random_tree(width, random.Random(7))]  # two requests, two trees, one launch
    expected = verify(sglang_gdn, trees, 2, width)
    bench.use(sglang_gdn, bench.patched_kernel(sglang_gdn))
    got = verify(sglang_gdn, trees, 2, width)
    assert all(same(e, g) for e, g in zip(expected, got)), shape


def test_a_chain_in_patched_tree_mode_equals_sglangs_chain_verify(bench, sglang_gdn):
    chain = verify(sglang_gdn, None, 2, 8)
    bench.use(sglang_gdn, bench.patched_kernel(sglang_gdn))
    tree_mode = verify(sglang_gdn, [[0] + list(range(7))] * 2, 2, 8)
    assert all(same(c, t) for c, t in zip(chain, tree_mode))


def test_the_comparison_catches_a_patch_that_skips_the_wrong_reload(bench, sglang_gdn):
    """Break check kept as a test: skipping when the parent is two nodes back must show."""
    trees = [SHAPES["binary"], SHAPES["spine with branches"]]
    expected = verify(sglang_gdn, trees, 2, 9)
    bench.use(sglang_gdn, bench.patched_kernel(sglang_gdn, bench.SKIP.replace("step_idx - 1", "step_idx - 2")))
    got = verify(sglang_gdn, trees, 2, 9)
    assert not same(expected[0], got[0])


def test_patched_source_changes_only_the_reload(bench, sglang_gdn):
    source = open(sglang_gdn.__file__, encoding="utf-8").read()
    patched = bench.patched_source(source)
    compile(patched, "patched", "exec")
    assert set(source.splitlines()) - set(patched.splitlines()) == {bench.RELOAD.rstrip("\n")}
    added = {line.strip() for line in set(patched.splitlines()) - set(source.splitlines())}
    assert added == {"if parent_step_idx != step_idx - 1:", bench.RELOAD.strip()}
    with pytest.raises(RuntimeError, match="found it 0 times"):
        bench.patched_source("x = 1\n")


def test_the_benchmarks_trees(bench):
    trees = bench.trees()
    assert all(len(p) == bench.WIDTH and all(0 <= q < max(i, 1) for i, q in enumerate(p)) for p in trees.values())
    assert bench.reloads(trees["chain"]) == 0 and bench.reloads(trees["star"]) == bench.WIDTH - 2
    # depth_first keeps the tree: same children counts per node and every parent before its child.
    assert bench.depth_first([0, 0, 0, 1, 2, 3]) == [0, 0, 1, 2, 0, 4]
    for name in ("peaked", "flat"):
        major, first = trees[f"{name} depth-major"], trees[f"{name} depth-first"]
        assert sorted(major.count(i) for i in range(bench.WIDTH)) == sorted(first.count(i) for i in range(bench.WIDTH))
        assert bench.reloads(first) <= bench.reloads(major)
