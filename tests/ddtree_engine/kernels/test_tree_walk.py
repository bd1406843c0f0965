"""The walk kernel (kernels/tree_walk/kernel.py) against its reference and core.walk.walk: the
accepted path, emitted tokens, commit length and bonus token, on every tree shape, with target
choices that stop at the root, go all the way down, and take non-first siblings."""

from __future__ import annotations

import random

import pytest
import torch

from tree_shapes import kary, random_depth_major_tree
from ddtree_engine.core.tree import DraftTree, compile_tree
from ddtree_engine.core.walk import walk
from ddtree_engine.kernels.tree_walk import reference

pytest.importorskip("triton")  # tests/ddtree_engine/conftest.py set TRITON_INTERPRET without a GPU

from ddtree_engine.kernels.tree_walk import kernel  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FIELDS = ("path", "emitted", "commit_len", "bonus")
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


SHAPES = {
    "root alone": [-1],
    "chain": list(range(-1, 12)),
    "star (depth 1)": [-1] + [0] * 8,
    "full binary": kary(2, 31),
    "full ternary": kary(3, 40),
    "random 23": random_depth_major_tree(23, 0),
    "random 65": random_depth_major_tree(65, 1),
}


def _tokens(parents, seed):
    """Siblings get distinct tokens (as the top-K of a depth does)."""
    rng = random.Random(seed)
    toks = [500]
    for i in range(1, len(parents)):
        used = {toks[j] for j in range(1, i) if parents[j] == parents[i]}
        toks.append(rng.choice([t for t in range(20) if t not in used]))
    return toks


def _depth(parents):
    out = []
    for p in parents:
        out.append(0 if p < 0 else out[p] + 1)
    return max(out)


def _choices(parents, tokens, seed, follow):
    """Target choices: at each node, with probability `follow` one of its children's tokens
    (a random one, so non-first siblings too), else a token no child has."""
    rng = random.Random(seed)
    out = []
    for i in range(len(parents)):
        kids = [j for j in range(len(parents)) if parents[j] == i]
        out.append(tokens[rng.choice(kids)] if kids and rng.random() < follow else 99)
    return out


def _run_kernel(parents, tokens, choices, n_out, walk_by=None):
    pad = n_out - len(parents)
    got = kernel.walk_arrays(
        torch.tensor(tokens + [tokens[0]] * pad, device=DEVICE),
        torch.tensor(parents + [-1] * pad, device=DEVICE),
        torch.tensor([len(parents)], device=DEVICE),
        torch.tensor(choices + [7] * pad, device=DEVICE),
        _depth(parents),
        **(walk_by or {}),
    )
    return tuple(g.cpu() for g in got)


WALKS = {  # JUMPS_UP_TO_ROWS, walk_arrays' keywords
    "steps": (0, {}),  # a reduction a step (`_walk`) at every size
    "jumps": (64, {}),  # pointer jumping (`_walk_jumps`) up to 64 rows, first of repeated siblings
    "jumps, distinct siblings": (64, {"distinct_siblings": True}),  # as TreeStep walks its own trees
}


@pytest.fixture(params=list(WALKS))
def walk_by(request, monkeypatch):
    """Each walk of the kernel: returns the keyword arguments `_run_kernel` passes."""
    rows, kwargs = WALKS[request.param]
    monkeypatch.setattr(kernel, "JUMPS_UP_TO_ROWS", rows)
    return kwargs


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("follow", [0.0, 0.7, 1.0])
def test_kernel_matches_the_reference(shape, follow, walk_by):
    parents = SHAPES[shape]
    tokens = _tokens(parents, len(shape))
    for seed in range(3):
        choices = _choices(parents, tokens, seed, follow)
        n_out = len(parents) + seed  # padding rows must never be walked into
        pad = n_out - len(parents)
        want = reference.walk_arrays(
            torch.tensor(tokens + [tokens[0]] * pad), torch.tensor(parents + [-1] * pad), len(parents),
            torch.tensor(choices + [7] * pad),
        )
        got = _run_kernel(parents, tokens, choices, n_out, walk_by)
        for field, g, w in zip(FIELDS, got, want):
            assert torch.equal(g, w), f"{shape} follow {follow} seed {seed}: {field} {g.tolist()} != {w.tolist()}"
        if follow == 1.0 and len(parents) > 1:
            assert int(got[2][0]) >= 2, f"{shape}: a full-follow walk accepted nothing"


@pytest.mark.parametrize("walk", ["steps", "jumps"])
@pytest.mark.parametrize("seed", range(4))
def test_repeated_sibling_tokens_walk_into_the_first(seed, walk, monkeypatch):
    """Siblings that carry the same token (no top-K makes them, a caller's tree may): the walk takes the first in index
    order, as the reference does, and never the later one's subtree."""
    monkeypatch.setattr(kernel, "JUMPS_UP_TO_ROWS", WALKS[walk][0])
    rng = random.Random(seed)
    parents = random_depth_major_tree(23, seed + 7)
    tokens = [500] + [rng.randrange(3) for _ in parents[1:]]  # 3 tokens: siblings repeat them
    for follow_seed in range(5):
        choices = _choices(parents, tokens, follow_seed, 0.9)
        want = reference.walk_arrays(torch.tensor(tokens), torch.tensor(parents), len(parents), torch.tensor(choices))
        got = _run_kernel(parents, tokens, choices, len(parents), WALKS[walk][1])
        for field, g, w in zip(FIELDS, got, want):
            assert torch.equal(g, w), f"seed {seed}/{follow_seed} ({walk}): {field} {g.tolist()} != {w.tolist()}"


def test_the_walk_jumps_by_default_up_to_64_rows(monkeypatch):
    """By default trees of up to 64 rows take `_walk_jumps` (one warp) and larger ones `_walk`; both give the
    reference's walk."""
    calls = []

    class Spy:
        def __init__(self, name, fn):
            self.name, self.fn = name, fn

        def __getitem__(self, grid):
            calls.append(self.name)
            return self.fn[grid]

    monkeypatch.setattr(kernel, "_walk", Spy("steps", kernel._walk))
    monkeypatch.setattr(kernel, "_walk_jumps", Spy("jumps", kernel._walk_jumps))
    for n, want_walk in ((1, "jumps"), (16, "jumps"), (33, "jumps"), (64, "jumps"), (65, "steps")):
        parents = random_depth_major_tree(n, n)
        tokens = _tokens(parents, n)
        choices = _choices(parents, tokens, n, 0.9)
        want = reference.walk_arrays(torch.tensor(tokens), torch.tensor(parents), n, torch.tensor(choices))
        got = _run_kernel(parents, tokens, choices, n)
        assert calls[-1] == want_walk, f"{n} rows took the {calls[-1]}"
        for field, g, w in zip(FIELDS, got, want):
            assert torch.equal(g, w), f"{n} rows: {field} differ"


def test_reference_is_core_walk():
    parents = SHAPES["random 65"]
    tokens = _tokens(parents, 5)
    tree = DraftTree(
        tokens=torch.tensor(tokens), parents=torch.tensor(parents), depths=torch.zeros(len(parents), dtype=torch.long),
        ranks=torch.zeros(len(parents), dtype=torch.long), scores=torch.zeros(len(parents), dtype=torch.float64),
    )
    compiled = compile_tree(tree, 0)
    for seed in range(6):
        choices = torch.tensor(_choices(parents, tokens, seed, 0.8))
        core = walk(compiled, choices)
        path, emitted, commit_len, bonus = reference.walk_arrays(tree.tokens, tree.parents, len(parents), choices)
        n = int(commit_len[0])
        assert path[:n].tolist() == core.path and emitted[: n - 1].tolist() == core.accepted_tokens
        assert int(bonus[0]) == core.bonus_token == int(emitted[n - 1])


def test_core_walk_on_the_kernel_equals_the_reference(monkeypatch):
    parents = SHAPES["full ternary"]
    tokens = _tokens(parents, 9)
    depths = [0]
    for p in parents[1:]:
        depths.append(depths[p] + 1)
    tree = DraftTree(
        tokens=torch.tensor(tokens), parents=torch.tensor(parents), depths=torch.tensor(depths),
        ranks=torch.zeros(len(parents), dtype=torch.long), scores=torch.zeros(len(parents), dtype=torch.float64),
    )
    compiled = compile_tree(tree, 0)
    calls = []
    real = kernel.walk_arrays
    monkeypatch.setattr(kernel, "walk_arrays", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    for seed in range(4):
        choices = torch.tensor(_choices(parents, tokens, seed, 0.9))
        monkeypatch.setenv("DDTREE_KERNELS", "reference")
        want = walk(compiled, choices)
        monkeypatch.setenv("DDTREE_KERNELS", "triton")
        got = walk(compiled, choices.to(DEVICE))
        assert (got.path, got.accepted_tokens, got.bonus_token) == (want.path, want.accepted_tokens, want.bonus_token)
    assert len(calls) == 4


@gpu
@needs_cuda
@pytest.mark.parametrize("n", [16, 32, 64, 257, 513])
def test_large_trees_on_the_gpu(n, walk_by):
    parents = random_depth_major_tree(n, n)
    tokens = _tokens(parents, n)
    for seed in range(4):
        choices = _choices(parents, tokens, seed, 0.9)
        want = reference.walk_arrays(torch.tensor(tokens), torch.tensor(parents), n, torch.tensor(choices))
        got = _run_kernel(parents, tokens, choices, n, walk_by)
        for field, g, w in zip(FIELDS, got, want):
            assert torch.equal(g, w), f"n={n} seed {seed}: {field} differ"
