"""The tree-compile kernel (kernels/tree_mask/kernel.py) against its reference: dense and
bit-packed ancestor mask, positions, first-child and next-sibling links, on every tree shape,
padded to a fixed N; and core.tree.compile_tree on the kernel equals it on the reference."""

from __future__ import annotations

import pytest
import torch

from tree_shapes import kary, random_depth_major_tree
from ddtree_engine.core.tree import DraftTree, compile_tree
from ddtree_engine.kernels.tree_mask import pack_mask, reference

pytest.importorskip("triton")  # tests/ddtree_engine/conftest.py set TRITON_INTERPRET without a GPU

from ddtree_engine.kernels.tree_mask import kernel  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FIELDS = ("mask", "packed", "positions", "first_child", "next_sibling")
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


SHAPES = {  # name: (parents, padded size N)
    "root alone": ([-1], 1),
    "root alone, padded": ([-1], 16),
    "chain": (list(range(-1, 15)), 16),
    "star (depth 1)": ([-1] + [0] * 8, 9),
    "full binary": (kary(2, 15), 15),
    "full ternary, padded": (kary(3, 13), 23),
    "random 17": (random_depth_major_tree(17, 0), 17),
    "random 40 padded to 65": (random_depth_major_tree(40, 1), 65),
    "random 257": (random_depth_major_tree(257, 2), 257),
    "chain 33 (two words)": (list(range(-1, 32)), 33),
}


def _depths(parents):
    out = []
    for p in parents:
        out.append(0 if p < 0 else out[p] + 1)
    return out


def _padded(parents, n_out):
    depths = _depths(parents)
    pad = n_out - len(parents)
    return torch.tensor(parents + [-1] * pad), torch.tensor(depths + [0] * pad)


# rows per program: 4 is the default, 16 what tree_step's one-launch kernel compiles with; 1 row (a program
# a row) on the smaller trees only (the interpreter runs programs one by one: 257 of them take 25 s).
ROW_CASES = [(shape, rows) for shape in SHAPES for rows in (1, 4, 16) if rows > 1 or SHAPES[shape][1] <= 65]


@pytest.mark.parametrize("gather", [False, True], ids=["loads", "gather"])
@pytest.mark.parametrize("shape,rows", ROW_CASES)
def test_kernel_matches_the_reference(shape, rows, gather):
    parents, n_out = SHAPES[shape]
    par, dep = _padded(parents, n_out)
    prefix = 1000 + len(shape)
    got = kernel.compile_tree_arrays(
        par.to(DEVICE), dep.to(DEVICE), torch.tensor([len(parents)], device=DEVICE),
        torch.tensor([prefix], device=DEVICE), max(_depths(parents)), rows_per_program=rows, gather=gather,
    )
    want = reference.compile_tree_arrays(par, dep, len(parents), prefix)
    for field, g, w in zip(FIELDS, got, want):
        g = g.cpu()
        diff = (g.long() != w.long()).sum().item()
        assert g.dtype == w.dtype and torch.equal(g, w), f"{shape}: {field} differ in {diff} entries"


def test_reference_mask_and_links_are_core_compile_trees():
    parents = random_depth_major_tree(30, 3)
    depths = _depths(parents)
    tree = DraftTree(
        tokens=torch.arange(30), parents=torch.tensor(parents), depths=torch.tensor(depths),
        ranks=torch.zeros(30, dtype=torch.long), scores=torch.zeros(30, dtype=torch.float64),
    )
    core = compile_tree(tree, 7)
    mask, _, positions, first_child, next_sibling = reference.compile_tree_arrays(tree.parents, tree.depths, 30, 7)
    assert torch.equal(mask, core.attention_mask) and torch.equal(positions, core.positions)
    assert torch.equal(first_child, core.first_child) and torch.equal(next_sibling, core.next_sibling)


def test_packed_bits_are_the_dense_mask():
    # Independent of pack_mask: decode each word bit by bit.
    parents, n_out = SHAPES["chain 33 (two words)"]
    par, dep = _padded(parents, n_out)
    mask, packed, *_ = kernel.compile_tree_arrays(
        par.to(DEVICE), dep.to(DEVICE), torch.tensor([n_out], device=DEVICE), torch.tensor([0], device=DEVICE), 32
    )
    mask, packed = mask.cpu(), packed.cpu()
    for i in range(n_out):
        for j in range(n_out):
            bit = (int(packed[i, j // 32]) >> (j % 32)) & 1
            assert bool(bit) == bool(mask[i, j]), f"row {i} col {j}"
    assert torch.equal(pack_mask(mask), packed)


def test_core_compile_tree_on_the_kernel_equals_the_reference(monkeypatch):
    parents = random_depth_major_tree(21, 4)
    tree = DraftTree(
        tokens=torch.arange(21), parents=torch.tensor(parents), depths=torch.tensor(_depths(parents)),
        ranks=torch.zeros(21, dtype=torch.long), scores=torch.zeros(21, dtype=torch.float64),
    )
    monkeypatch.setenv("DDTREE_KERNELS", "reference")
    want = compile_tree(tree, 40)
    calls = []
    real = kernel.compile_tree_arrays
    monkeypatch.setattr(kernel, "compile_tree_arrays", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setenv("DDTREE_KERNELS", "triton")
    # On a GPU host the kernel runs natively on the tree's device; on a CPU host, in the interpreter.
    on_device = DraftTree(**{f: getattr(tree, f).to(DEVICE) for f in ("tokens", "parents", "depths", "ranks", "scores")})
    got = compile_tree(on_device, 40)
    assert calls == [1]
    for field in ("attention_mask", "positions", "parents", "first_child", "next_sibling"):
        assert torch.equal(getattr(got, field).cpu(), getattr(want, field)), field


@gpu
@needs_cuda
@pytest.mark.parametrize("gather", [False, True], ids=["loads", "gather"])
@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize("n", [16, 23, 65, 257, 513])
def test_large_trees_on_the_gpu(n, rows, gather):
    parents = random_depth_major_tree(n - 3, n)
    par, dep = _padded(parents, n)
    got = kernel.compile_tree_arrays(
        par.cuda(), dep.cuda(), torch.tensor([n - 3], device="cuda"), torch.tensor([5], device="cuda"), max(_depths(parents)),
        rows_per_program=rows, gather=gather,
    )
    want = reference.compile_tree_arrays(par, dep, n - 3, 5)
    for field, g, w in zip(FIELDS, got, want):
        assert torch.equal(g.cpu(), w), f"n={n}: {field} differ"


def test_the_compile_climbs_by_gather_by_default_between_its_bounds(monkeypatch):
    """gather=None takes the gather from GATHER_FROM_ROWS to GATHER_UP_TO_ROWS rows (where the H100 step was faster
    with it) and the loads outside; the launch gets that choice and either gives the reference's arrays."""
    assert [kernel.climbs_by_gather(n) for n in (16, 33, 48, 49, 129, 193, 194, 257)] == [
        False, False, False, True, True, True, False, False]
    launched = []
    real = kernel._compile_tree

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append(kwargs["GATHER"])
                return real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(kernel, "_compile_tree", Spy())
    for n in (16, 65, 200):
        parents = random_depth_major_tree(n - 2, n)
        par, dep = _padded(parents, n)
        got = kernel.compile_tree_arrays(par.to(DEVICE), dep.to(DEVICE), torch.tensor([n - 2], device=DEVICE),
                                         torch.tensor([9], device=DEVICE), max(_depths(parents)))
        want = reference.compile_tree_arrays(par, dep, n - 2, 9)
        for field, g, w in zip(FIELDS, got, want):
            assert torch.equal(g.cpu(), w), f"n={n}: {field} differ"
    assert launched == [False, True, False]
