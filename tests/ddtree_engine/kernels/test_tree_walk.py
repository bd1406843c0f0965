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


def _any_tree(n, rng):
    """A random tree on n rows, root 0, its other rows' labels shuffled: parents after their children too."""
    par = [-1] + [rng.randrange(0, i) for i in range(1, n)]
    perm = [0] + rng.sample(range(1, n), n - 1)
    out = [-1] * n
    for old in range(1, n):
        out[perm[old]] = perm[par[old]]
    return out


@pytest.mark.parametrize("seed", range(12))
def test_any_tree_with_junk_padding_int32_inputs_and_dirty_outputs(seed, walk_by):
    """Trees not in depth-major order, padding rows of junk (parents into the tree, tokens its choices may match),
    int32 or int64 inputs, output buffers holding garbage: the reference's walk, every output place written."""
    rng = random.Random(seed)
    n_out = rng.randint(2, 64)
    n = rng.randint(1, n_out)
    parents = _any_tree(n, rng)
    distinct = walk_by.get("distinct_siblings", False)
    tokens = [500]
    for i in range(1, n):
        used = {tokens[j] for j in range(1, i) if parents[j] == parents[i]} if distinct else set()
        tokens.append(rng.choice([t for t in range(40 if distinct else 3) if t not in used]))
    choices = _choices(parents, tokens, seed, 0.9)
    pad = n_out - n
    # Padding rows of junk: most hang under a real row with its choice as their token (walked into, were they real).
    par_pad = [rng.choice([rng.randrange(0, n), rng.randrange(0, n), -1, rng.randrange(0, n_out)]) for _ in range(pad)]
    tok_p = tokens + [choices[p] if 0 <= p < n else rng.randrange(0, 3) for p in par_pad]
    par_p = parents + par_pad
    ch_p = choices + [rng.randrange(0, 3) for _ in range(pad)]
    want = reference.walk_arrays(torch.tensor(tok_p), torch.tensor(par_p), n, torch.tensor(ch_p))
    dtypes = [rng.choice([torch.int32, torch.int64]) for _ in range(3)]
    out = tuple(torch.full((size,), 12345, dtype=torch.int64, device=DEVICE) for size in (n_out, n_out, 1, 1))
    got = kernel.walk_arrays(
        torch.tensor(tok_p, dtype=dtypes[0], device=DEVICE), torch.tensor(par_p, dtype=dtypes[1], device=DEVICE),
        torch.tensor([n], device=DEVICE), torch.tensor(ch_p, dtype=dtypes[2], device=DEVICE), n, out=out,
        **walk_by,
    )
    for field, g, w in zip(FIELDS, got, want):
        assert torch.equal(g.cpu(), w), f"seed {seed} ({n} of {n_out} rows): {field} {g.cpu().tolist()} != {w.tolist()}"


MALFORMED = {  # (tokens, parents, choices): rows the reference never reaches
    "an orphan (parent -1)": ([5, 1, 7, 9], [-1, 0, 1, -1], [1, 7, 3, 9]),
    "its own parent": ([5, 1, 2], [-1, 0, 2], [1, 2, 2]),
    "a parent past the tree": ([5, 1, 2, 3], [-1, 0, 9, 1], [1, 2, 3, 4]),
    "a two-cycle": ([5, 1, 2, 3], [-1, 0, 3, 2], [1, 2, 3, 2]),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_unreachable_rows_of_a_malformed_tree_are_never_walked(case, monkeypatch):
    """Rows no chain from the root reaches (an orphan, a self- or out-of-range parent, a cycle) are not walked and no
    place past the buffers is written: the jumping walk as the reference (the stepping walk never climbs, so it cannot
    meet them)."""
    monkeypatch.setattr(kernel, "JUMPS_UP_TO_ROWS", 64)
    tokens, parents, choices = MALFORMED[case]
    n = len(tokens)
    want = reference.walk_arrays(torch.tensor(tokens), torch.tensor(parents), n, torch.tensor(choices))
    out = tuple(torch.full((size,), 12345, dtype=torch.int64, device=DEVICE) for size in (n + 4, n + 4, 1, 1))
    got = kernel.walk_arrays(  # into the first n places of buffers 4 longer
        torch.tensor(tokens, device=DEVICE), torch.tensor(parents, device=DEVICE), torch.tensor([n], device=DEVICE),
        torch.tensor(choices, device=DEVICE), n, out=tuple(o[:n] if o.shape[0] > 1 else o for o in out),
    )
    for field, g, w in zip(FIELDS, got, want):
        assert torch.equal(g.cpu(), w), f"{case}: {field} {g.cpu().tolist()} != {w.tolist()}"
    assert out[0][n:].tolist() == [12345] * 4 and out[1][n:].tolist() == [12345] * 4, f"{case}: wrote past the tree"


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
