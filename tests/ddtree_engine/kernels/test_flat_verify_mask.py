"""The flat verify-mask kernel (kernels/tree_mask/kernel.py: flat_verify_mask) against its reference,
which writes flat_custom_mask (the layout SGLang's TARGET_VERIFY reads: per request [C, prefix + C]
row-major, the prefix all True; checked cell by cell in sglang_worker/test_padding.py) into a buffer.
The kernel reads the prefix lengths on the device, so the DDTREE tree step's CUDA graph writes the mask
straight into SGLang's buffer."""

from __future__ import annotations

import pytest
import torch

from ddtree_engine.kernels.tree_mask import reference
from ddtree_engine.sglang_plugin.padding import flat_custom_mask

pytest.importorskip("triton")  # tests/ddtree_engine/conftest.py set TRITON_INTERPRET without a GPU

from ddtree_engine.kernels.tree_mask import kernel  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SENTINEL = 7


def blocks(bs, c, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(bs, c, c, generator=g) < 0.4).to(DEVICE)


CASES = [  # bs, C, prefix lengths
    (1, 16, [0]),
    (1, 16, [37]),
    (3, 5, [1, 0, 70]),  # a prefix over several of the kernel's column steps (16 in these tests)
    (4, 9, [16, 15, 17, 3]),
    (2, 1, [5, 2]),
]


@pytest.mark.parametrize("bs,c,prefix", CASES)
def test_the_reference_is_the_layout_sglang_reads(bs, c, prefix):
    block = blocks(bs, c, bs + c)
    want = flat_custom_mask(list(block), prefix)
    out = torch.full((want.numel() + 11,), SENTINEL, dtype=torch.uint8, device=DEVICE)
    reference.flat_verify_mask(block, torch.tensor(prefix, device=DEVICE), out)
    assert torch.equal(out[: want.numel()], want.to(torch.uint8))
    assert bool((out[want.numel():] == SENTINEL).all())  # nothing after the batch's cells


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bool])
@pytest.mark.parametrize("bs,c,prefix", CASES)
def test_the_kernel_equals_the_reference(bs, c, prefix, dtype):
    block = blocks(bs, c, 3 * bs + c)
    lens = torch.tensor(prefix, device=DEVICE).view(-1, 1)  # TreePrep holds them as [bs, 1] int64
    n = sum(c * (p + c) for p in prefix)
    want = torch.zeros(n + 5, dtype=dtype, device=DEVICE)
    if dtype == torch.bool:  # alternating, so a stray write of either value past the batch's cells shows
        got = (torch.arange(n + 5, device=DEVICE) % 2).to(torch.bool)
    else:
        got = torch.full((n + 5,), SENTINEL, dtype=dtype, device=DEVICE)
    tail = got[n:].clone()
    reference.flat_verify_mask(block, lens, want)
    kernel.flat_verify_mask(block, lens, got, cols_per_step=16)
    assert torch.equal(got[:n], want[:n])
    assert torch.equal(got[n:], tail)


def test_cells_past_the_buffer_are_not_written():
    block = blocks(2, 6, 1)
    prefix = torch.tensor([20, 30], device=DEVICE)
    n = 6 * 26 + 6 * 36
    whole = torch.full((n,), SENTINEL, dtype=torch.uint8, device=DEVICE)
    short = n - 50
    kernel.flat_verify_mask(block, prefix, whole[:short], cols_per_step=16)
    want = torch.zeros(n, dtype=torch.uint8, device=DEVICE)
    reference.flat_verify_mask(block, prefix, want)
    assert torch.equal(whole[:short], want[:short])
    assert bool((whole[short:] == SENTINEL).all())


def test_bad_inputs_are_refused():
    out = torch.zeros(100, dtype=torch.uint8, device=DEVICE)
    with pytest.raises(ValueError, match=r"expected block \[bs, C, C\] bool"):
        kernel.flat_verify_mask(torch.zeros(1, 3, 4, dtype=torch.bool, device=DEVICE), torch.zeros(1, dtype=torch.int64, device=DEVICE), out)
    with pytest.raises(ValueError, match="expected 2 integer prefix lengths"):
        kernel.flat_verify_mask(blocks(2, 3, 0), torch.zeros(3, dtype=torch.int64, device=DEVICE), out)
    with pytest.raises(ValueError, match="flat bool or uint8"):
        kernel.flat_verify_mask(blocks(1, 3, 0), torch.zeros(1, dtype=torch.int64, device=DEVICE), out.to(torch.int32))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_graph_replays_the_mask_for_new_prefix_lengths():
    block = blocks(3, 16, 2)
    prefix = torch.tensor([[10], [0], [300]], device="cuda")
    out = torch.full((3 * 16 * (2000 + 16),), SENTINEL, dtype=torch.uint8, device="cuda")
    kernel.flat_verify_mask(block, prefix, out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel.flat_verify_mask(block, prefix, out)
    for lens in ([[5], [1500], [17]], [[0], [0], [0]], [[999], [3], [1]]):
        prefix.copy_(torch.tensor(lens, device="cuda"))
        block.copy_(blocks(3, 16, lens[0][0]))
        graph.replay()
        want = flat_custom_mask(list(block), [l[0] for l in lens]).to(torch.uint8)
        assert torch.equal(out[: want.numel()], want), lens
