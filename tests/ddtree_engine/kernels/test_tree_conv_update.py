"""The tree causal-conv1d update in SGLang's verify layout (kernels/tree_conv_update) against its reference.

The arrays are those SGLang 0.5.23's tree conv update leaves (tests/ddtree_engine/sglang_plugin/
test_tree_conv_update.py checks the kernel against SGLang's own, bit for bit): outputs, every row's window
in the intermediate buffer, the parents derived from the first-child / next-sibling links, and the cache
line's new state. Trees come as the plugin lays them out (tree_mask.reference.compile_tree_arrays: depth-major,
links -1 on pad rows). On a CPU host the kernel runs in Triton's interpreter; on a GPU natively.
"""

from __future__ import annotations

import random

import pytest
import torch

from tree_shapes import depth_major, kary, random_tree
from ddtree_engine.kernels import tree_conv_update as tcu
from ddtree_engine.kernels.tree_mask.reference import compile_tree_arrays

pytest.importorskip("triton")
# Without a GPU, tests/ddtree_engine/conftest.py has set TRITON_INTERPRET=1 before triton loaded.
from ddtree_engine.kernels.tree_conv_update import kernel, reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


SHAPES = {
    "root only": [-1],
    "chain": list(range(-1, 9)),
    "star (depth 1)": [-1] + [0] * 9,
    "full binary": kary(2, 15),
    "8-ary, two levels": kary(8, 20),
    "random 17": depth_major(random_tree(17, 0)),
    "random 33": depth_major(random_tree(33, 1)),
    "chain then fork": [-1, 0, 1, 2, 2, 3, 4],
    # 30 siblings under row 1: the longest sibling chain the pointer jumping resolves here (a fan under the root
    # would pass with unresolved links too, their fallback parent being the root's 0).
    "fan under a child": [-1, 0] + [1] * 30,
}


def links(parents: list[int], rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The plugin's first-child / next-sibling arrays for a depth-major tree padded to `rows`."""
    padded = torch.tensor(parents + [-1] * (rows - len(parents)))
    depths = torch.zeros(rows, dtype=torch.long)
    _, _, _, first, sibling = compile_tree_arrays(padded, depths, len(parents), 0)
    return first, sibling


def case(trees: list[list[int]], rows: int, channels: int, width: int, dtype, seed: int, *, bias=True,
         intermediate=True, indices=True, pad_slot_at=None):
    g = torch.Generator().manual_seed(seed)
    batch, lines = len(trees), len(trees) + 3
    first, sibling = zip(*(links(t, rows) for t in trees))
    rnd = lambda *shape: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    # SGLang's layouts: x a transposed [B, T, C] view, the state [lines, K-1, C] seen as [lines, C, K-1].
    args = dict(
        x=rnd(batch, rows, channels).transpose(1, 2),
        conv_state=rnd(lines, width - 1, channels).transpose(1, 2),
        weight=rnd(channels, width),
        bias=rnd(channels) if bias else None,
        silu=True,
        conv_state_indices=torch.randperm(lines, generator=g)[:batch].to(torch.int32) if indices else None,
        intermediate_conv_window=torch.zeros(lines, rows, channels, width - 1, dtype=dtype) if intermediate else None,
        intermediate_state_indices=torch.randperm(lines, generator=g)[:batch].to(torch.int32) if indices else None,
        retrieve_next_token=torch.stack(first),
        retrieve_next_sibling=torch.stack(sibling),
        retrieve_parent_token=torch.full((batch, rows), -7, dtype=torch.long),
    )
    if pad_slot_at is not None:
        args["conv_state_indices"][pad_slot_at] = -1
    return args


def copies(args: dict, device=DEVICE) -> dict:
    """args with every tensor copied to `device` (strides kept: clone and .to preserve them)."""
    return {k: (v.clone().to(device) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


def arrays(out, args: dict) -> list:
    """A call's arrays on the CPU: its output, and of the `args` it ran on the conv state, the windows (None where
    not kept) and the parents (as int64: SGLang's graph buffers are int32)."""
    got = [out, args["conv_state"], args["intermediate_conv_window"]]
    return [a.cpu() if a is not None else None for a in got] + [args["retrieve_parent_token"].long().cpu()]


def run_both(args: dict):
    """(reference's arrays, kernel's arrays): out, conv_state, windows, parents, each side on its own copies."""
    results = []
    for side, device in ((reference, "cpu"), (kernel, DEVICE)):
        mine = copies(args, device)
        results.append(arrays(side.tree_conv_update(**mine), mine))
    return results


def assert_same(ref, got, dtype, skip=()):
    """Equal arrays; the requests in `skip` (pad slots) have no outputs or parents to compare."""
    keep = [b for b in range(ref[0].shape[0]) if b not in skip]
    out_ref, state_ref, win_ref, par_ref = ref
    out, state, win, par = got
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out[keep].float(), out_ref[keep].float(), rtol=tol, atol=tol)
    assert torch.equal(state, state_ref)
    assert (win is None) == (win_ref is None) and (win is None or torch.equal(win, win_ref))
    assert torch.equal(par[keep], par_ref[keep])


@pytest.mark.parametrize("width", [2, 3, 4, 5])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_tree_shape_and_width_matches_the_reference(name, width):
    parents = SHAPES[name]
    args = case([parents], len(parents), 20, width, torch.float32, seed=width)
    assert_same(*run_both(args), torch.float32)


def test_a_batch_of_different_trees_with_pad_rows_and_a_pad_slot():
    trees = [SHAPES["random 17"], SHAPES["star (depth 1)"], SHAPES["chain"], SHAPES["root only"]]
    args = case(trees, 24, 40, 4, torch.float16, seed=3, pad_slot_at=2)
    ref, got = run_both(args)
    assert_same(ref, got, torch.float16, skip=(2,))
    # The pad slot's request is skipped: no parents written (the -7s stay).
    assert torch.all(got[3][2] == -7)


@pytest.mark.parametrize("block_r", [16, 4])
@pytest.mark.parametrize("parent_dtype", [torch.int64, torch.int32], ids=str)  # SGLang's eager and graph buffers
@pytest.mark.parametrize("name", ["random 17", "chain", "star (depth 1)"])
def test_parents_given_take_the_parents_from_retrieve_parent_token(name, parent_dtype, block_r):
    """parents_given (the later layers of one verify forward): the parents the first launch wrote are read, not found
    again, so the arrays are the reference's; with other parents in the buffer, other windows (it reads them); with
    parents out of [0, rows), no read outside x (clamped). 24 rows: with 16-row blocks the first block's ancestors
    come from the registers and the second's partly from them, partly read; with 4-row blocks mostly read."""
    trees = [SHAPES[name], SHAPES["random 17"]]
    args = case(trees, 24, 40, 4, torch.float32, seed=5, pad_slot_at=None)
    ref, _ = run_both(args)
    given = copies(args)
    given["retrieve_parent_token"] = ref[3].to(parent_dtype).to(DEVICE)
    given["retrieve_next_token"] = torch.full_like(given["retrieve_next_token"], -1)  # not read
    given["retrieve_next_sibling"] = torch.full_like(given["retrieve_next_sibling"], -1)
    out = kernel.tree_conv_update(**given, parents_given=True, block_r=block_r)
    assert_same(ref, arrays(out, given), torch.float32)
    # Every row's parent the row before it (not these padded trees): other outputs.
    wrong = copies(args)
    wrong["retrieve_parent_token"] = torch.clamp(torch.arange(24) - 1, min=0).repeat(2, 1).to(parent_dtype).to(DEVICE)
    assert not torch.equal(kernel.tree_conv_update(**wrong, parents_given=True, block_r=block_r).cpu(), ref[0])
    # A buffer of garbage (another forward's, never written): indices far outside the rows read x's last row at most.
    garbage = copies(args)
    garbage["retrieve_parent_token"] = torch.tensor([[10**6, -(10**6)] * 12] * 2, dtype=parent_dtype, device=DEVICE)
    assert torch.isfinite(kernel.tree_conv_update(**garbage, parents_given=True, block_r=block_r)).all()


def test_parents_given_for_requests_shorter_than_a_row_block():
    """10 rows, 16-row blocks, a parent buffer of exactly [batch, rows] (SGLang's at budget 9): every ancestor from
    the registers, the block's rows past the request neither read from the buffer nor written."""
    trees = [SHAPES["chain then fork"], SHAPES["star (depth 1)"], SHAPES["chain"]]
    args = case(trees, 10, 24, 4, torch.float32, seed=8)
    ref, _ = run_both(args)
    given = copies(args)
    given["retrieve_parent_token"] = ref[3].to(torch.int32).to(DEVICE).contiguous()
    assert tuple(given["retrieve_parent_token"].shape) == (3, 10)
    out = kernel.tree_conv_update(**given, parents_given=True, block_r=16)
    assert_same(ref, arrays(out, given), torch.float32)


def test_cache_line_indices_read_through_their_strides():
    args = case([SHAPES["random 17"], SHAPES["chain"]], 17, 16, 4, torch.float32, seed=4)
    expected = run_both(args)[0]
    for name in ("conv_state_indices", "intermediate_state_indices"):
        spread = torch.full((4,), 99, dtype=torch.int32)
        spread[::2] = args[name]
        args[name] = spread.to(DEVICE)[::2]  # stride 2 (run_both's clones would make it contiguous)
    mine = {k: (v.clone().to(DEVICE) if isinstance(v, torch.Tensor) and not k.endswith("_indices") else v)
            for k, v in args.items()}
    assert_same(expected, arrays(kernel.tree_conv_update(**mine), mine), torch.float32)


def test_several_channel_blocks_a_request():
    """300 channels: three programs a request, each with its own scratch, its channels of the state and windows."""
    args = case([SHAPES["random 33"], SHAPES["fan under a child"]], 40, 300, 4, torch.float32, seed=9, pad_slot_at=1)
    ref, got = run_both(args)
    assert_same(ref, got, torch.float32, skip=(1,))


@pytest.mark.parametrize("bias,intermediate,indices", [(False, True, True), (True, False, True), (True, False, False)])
def test_without_bias_windows_or_cache_indices(bias, intermediate, indices):
    args = case([SHAPES["full binary"], SHAPES["random 17"]], 17, 33, 4, torch.float32, seed=5,
                bias=bias, intermediate=intermediate, indices=indices)
    assert_same(*run_both(args), torch.float32)


@pytest.mark.parametrize("rows", [129, 257])
def test_wide_trees_one_launch(rows):
    """The widths at which SGLang's own kernel compiles for minutes (budget 128 and 256, topk 8)."""
    parents = depth_major([-1] + [random.Random(rows).randrange(max(0, i - 8), i) for i in range(1, rows)])
    args = case([parents], rows, 8, 4, torch.float32, seed=rows)
    assert_same(*run_both(args), torch.float32)


def test_parents_are_the_trees_and_every_window_is_the_rows_ancestry():
    """What the arrays mean, not only that two implementations agree: a depth-major tree's parents come back,
    and row t's window holds x at t, its parent and grandparent (the state's columns above the root)."""
    parents = SHAPES["random 33"]
    args = case([parents], 40, 6, 4, torch.float32, seed=7)
    _, (out, state, win, par) = run_both(args)
    assert par[0].tolist() == [0] + parents[1:] + [0] * (40 - len(parents))
    x, old = args["x"][0], args["conv_state"][int(args["conv_state_indices"][0])]
    line = int(args["intermediate_state_indices"][0])
    for t in range(len(parents)):
        chain = [t]
        while len(chain) < 3:
            chain.append(parents[chain[-1]] if chain[-1] > 0 else chain[-1] - 1)
        expect = [x[:, v] if v >= 0 else old[:, 3 + v] for v in reversed(chain)]  # oldest first
        assert torch.equal(win[line, t], torch.stack(expect, dim=1)), t
    # The line's new state: the last three rows' inputs, as a chain of 40 would leave it.
    assert torch.equal(state[int(args["conv_state_indices"][0])], x[:, -3:])


@pytest.mark.parametrize("forced,expected", [("", "kernel" if DEVICE == "cuda" else "reference"),
                                              ("reference", "reference"), ("triton", "kernel")])
def test_the_dispatcher_picks_the_kernel_on_cuda_and_the_reference_elsewhere(monkeypatch, forced, expected):
    monkeypatch.setenv("DDTREE_KERNELS", forced)
    args = case([SHAPES["chain"]], 10, 8, 4, torch.float32, seed=1)
    args = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    called = []
    monkeypatch.setattr(reference, "tree_conv_update", lambda *a, **k: called.append("reference") or a[0])
    monkeypatch.setattr(kernel, "tree_conv_update", lambda *a, **k: called.append("kernel") or a[0])
    tcu.tree_conv_update(**args)
    assert called == [expected]


@pytest.mark.parametrize("field,value,message", [
    ("weight", torch.randn(8, 6), r"expected a conv width of 2 to 5, got weight \(8, 6\)"),
    ("weight", torch.randn(7, 4), r"expected weight \[8, K\] and conv_state \[lines, 8, >= K-1\]"),
    ("retrieve_next_token", torch.zeros(1, 9, dtype=torch.long), r"expected retrieve_next_token \[>= 1, >= 10\]"),
    ("retrieve_parent_token", torch.zeros(10, 2, dtype=torch.long)[:, :1].t(), r"retrieve_parent_token \[>= 1, >= 10\] contiguous"),
])
def test_the_launcher_refuses_inconsistent_inputs(field, value, message):
    args = case([SHAPES["chain"]], 10, 8, 4, torch.float32, seed=1)
    args[field] = value
    with pytest.raises(ValueError, match=message):
        kernel.tree_conv_update(**args)


def test_one_compile_serves_every_width(monkeypatch):
    """At 10 and 257 rows, batch 1 and 3: the launcher's compile-time constants are the same, and they are
    `kernel.constexprs` (what benchmarks/sglang_conv_compile.py compiles); every integer argument that differs is
    one the kernel does not specialise on (Triton would compile a variant for 1 and for multiples of 16)."""
    import inspect

    names = list(inspect.signature(kernel._tree_conv_update_kernel.fn).parameters)
    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((args, {k: v for k, v in kw.items() if k.isupper()}))

    monkeypatch.setattr(kernel, "_tree_conv_update_kernel", Recorder())
    for trees, rows in (([SHAPES["chain"]], 10), ([SHAPES["random 33"]] * 3, 257)):
        args = case(trees, rows, 8, 4, torch.float32, seed=1)
        kernel.tree_conv_update(**args)
    (first, first_constants), (second, second_constants) = launches
    assert first_constants == second_constants
    expected = kernel.constexprs(4, has_bias=True, silu=True, has_indices=True, save_intermediate=True)
    assert first_constants == {**expected, "GDC": False}
    changed = {name for name, a, b in zip(names, first, second) if isinstance(a, int) and a != b}
    assert changed and changed <= set(kernel.RUNTIME_ARGS), changed - set(kernel.RUNTIME_ARGS)


def test_x_and_the_state_in_different_dtypes_are_refused():
    args = case([SHAPES["chain"]], 10, 8, 4, torch.float16, seed=1)
    args["conv_state"] = args["conv_state"].float()
    with pytest.raises(ValueError, match=r"expected x and conv_state in one dtype .* got torch.float16 and torch.float32"):
        kernel.tree_conv_update(**args)
