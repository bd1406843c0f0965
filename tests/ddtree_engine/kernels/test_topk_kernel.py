"""The top-K log-probability kernel (kernels/topk_logprobs/kernel.py) against its reference:
same token ids exactly (ties to the lower id), log-probs within 1e-6 of the float64 reference,
on named, seeded cases; in Triton's interpreter on a CPU host, natively on a GPU (`gpu` cases
at real vocabulary sizes), with the block size varied so ties and -inf straddle block borders."""

from __future__ import annotations

import os
import sys

import pytest
import torch

# Without a GPU these run in Triton's interpreter: tests/ddtree_engine/conftest.py sets
# TRITON_INTERPRET=1 before triton is first imported.
pytest.importorskip("triton")

from ddtree_engine.kernels import topk_logprobs  # noqa: E402
from ddtree_engine.kernels.topk_logprobs import kernel, reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 1e-6
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _logits(depths: int, vocab: int, seed: int, dtype=torch.float32, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(depths, vocab, generator=g) * scale).to(dtype)


def _tied(depths: int, vocab: int, seed: int) -> torch.Tensor:
    """Few distinct values: most tokens tie with others, the argmax too."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 4, (depths, vocab), generator=g).float()


def _masked(depths: int, vocab: int, seed: int) -> torch.Tensor:
    """Most tokens at -inf (zero probability), fewer finite ones than K in some rows."""
    x = _logits(depths, vocab, seed)
    x[:, 3:] = float("-inf")
    x[0, 1] = -0.0
    x[0, 2] = 0.0
    return x


def _nonfinite(depths: int, vocab: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    """What an overflowed drafter writes: NaN tokens (the row's argmax among them), a row with two +inf tokens,
    a NaN row, and a row of NaN but three finite tokens (fewer than K)."""
    x = _logits(depths, vocab, seed)
    x[0, 3::29] = float("nan")
    x[0, int(x[0].nan_to_num(nan=-1e9).argmax())] = float("nan")
    x[1, 7] = x[1, vocab - 2] = float("inf")
    x[1, 9] = float("nan")
    x[2] = float("nan")
    x[3] = float("nan")
    x[3, [1, vocab // 2, vocab - 1]] = torch.tensor([0.5, -1.0, 2.0])
    return x.to(dtype)


CASES = {  # name: (logits, k)
    "one depth": (_logits(1, 7, 0), 3),
    "odd sizes": (_logits(5, 13, 1), 4),
    "k = V": (_logits(3, 6, 2), 6),
    "k = 1": (_logits(4, 11, 3), 1),
    "several chunks, bf16": (_logits(3, 9000, 4, torch.bfloat16), 8),
    "several chunks, fp16": (_logits(2, 5003, 5, torch.float16), 5),
    "ties everywhere": (_tied(4, 300, 6), 8),
    "all equal": (torch.zeros(3, 17), 8),
    "-inf and signed zeros": (_masked(3, 40, 7), 8),
    "large logits": (_logits(3, 500, 8, scale=1e4), 8),
    "k = 16, bf16": (_logits(2, 3001, 14, torch.bfloat16), 16),
    "NaN and +inf": (_nonfinite(5, 300, 22), 8),
    "NaN and +inf, bf16": (_nonfinite(5, 300, 23, torch.bfloat16), 8),
    "NaN and +inf, fp16": (_nonfinite(5, 300, 24, torch.float16), 4),
}


def _border_ties(vocab: int, span: int, depths: int = 2) -> torch.Tensor:
    """The best logits sit on both sides of every `span` border (and the row's ends), equal."""
    x = _logits(depths, vocab, 15, scale=0.5)
    for border in range(span, vocab, span):
        x[:, border - 1 : border + 1] = 4.0
    x[:, 0] = x[:, -1] = 4.0
    x[1, ::span] = 3.0
    return x


def _compare(name: str, logits: torch.Tensor, k: int, **params) -> None:
    vals, ids = kernel.topk_logprobs(logits.to(DEVICE), k, **params)
    want_vals, want_ids = reference.sorted_topk_logprobs(logits, k)
    assert ids.cpu().tolist() == want_ids.tolist(), f"{name}: ids differ"
    got, want = vals.cpu(), want_vals
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite), f"{name}: -inf positions differ"
    diff = (got[finite] - want[finite]).abs().max().item() if finite.any() else 0.0
    assert vals.dtype == torch.float64 and diff < TOL, f"{name}: max abs diff {diff:.3e}"


@pytest.fixture(params=["default", "tl.topk"])
def selection(request, monkeypatch):
    """Each case as the kernel runs here (on the CPU the interpreter takes the rounds, `_best_keys`) and with
    the selections forced through `tl.topk`, as on the GPU."""
    if request.param == "tl.topk":
        import triton.language as tl

        monkeypatch.setattr(kernel, "_TOPK", tl.constexpr(True))
    return request.param


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_matches_the_reference(name, selection):
    logits, k = CASES[name]
    _compare(name, logits, k)


BLOCK_CASES = {  # name: (logits, k, block): ceil(V / block) programs per row, then one merge
    "ties, V not a multiple of the block": (_tied(3, 301, 9), 8, 64),
    "ties, many blocks": (_tied(3, 301, 9), 8, 16),
    "ties, one token per block": (_tied(2, 50, 16), 8, 1),
    "ties at block borders": (_border_ties(300, 32), 8, 32),
    "ties at block borders, k = 16": (_border_ties(300, 8), 16, 8),
    "ascending: the last block holds the best": (torch.arange(2000.0).repeat(2, 1) / 100, 8, 64),
    "descending: the first block holds the best": (torch.arange(2000.0, 0, -1).repeat(2, 1) / 100, 8, 64),
    "whole blocks at -inf": (_masked(3, 400, 17).roll(200, dims=1), 8, 16),
    "fewer tokens in a block than K": (_logits(2, 103, 18), 8, 4),
    "block larger than V": (_logits(3, 20, 19), 4, 8192),
    "random fp32, k = 16": (_logits(2, 3000, 20), 16, 32),
    "random bf16, k = 8": (_logits(2, 3000, 21, torch.bfloat16), 8, 64),
    "NaN and +inf across blocks": (_nonfinite(5, 300, 25), 8, 16),
}


@pytest.mark.parametrize("group", [1, 2, 8])
@pytest.mark.parametrize("name", list(BLOCK_CASES))
def test_block_borders_do_not_change_the_result(name, group):
    # group 1: K rounds over the whole block; 2 and 8 (the default): the group stage first.
    logits, k, block = BLOCK_CASES[name]
    _compare(name, logits, k, block=block, group=group)


@pytest.mark.parametrize("group", [1, 8])
@pytest.mark.parametrize("name", list(BLOCK_CASES))
def test_block_borders_through_tl_topk(name, group, monkeypatch):
    # The first pass's selections (the block's keys with group 1, up to `_TOPK_MAX`; the group stage's two
    # with group 8) and the merge's through `tl.topk`, the GPU's path.
    import triton.language as tl

    monkeypatch.setattr(kernel, "_TOPK", tl.constexpr(True))
    logits, k, block = BLOCK_CASES[name]
    _compare(name, logits, k, block=block, group=group)


GROUP_CASES = {  # name: (logits, k, block, group): the group stage's own borders
    "the best K in one group": (torch.arange(600.0).repeat(2, 1).flip(1) / 10, 8, 64, 16),
    "ties across groups, first group wins": (_tied(2, 512, 23), 8, 256, 4),
    "one group a block": (_logits(2, 700, 24), 8, 64, 64),
    "more groups chosen than exist": (_logits(2, 300, 25), 16, 32, 8),
    "a group straddles V": (_logits(2, 1000 + 3, 26), 8, 512, 32),
    "ties at group borders, k = 16": (_border_ties(640, 16), 16, 128, 16),
    "every group at -inf but one token": (_masked(2, 300, 27).roll(150, dims=1), 8, 128, 8),
}


@pytest.mark.parametrize("name", list(GROUP_CASES))
def test_groups_do_not_change_the_result(name, selection):
    logits, k, block, group = GROUP_CASES[name]
    _compare(name, logits, k, block=block, group=group)


def _half_edges(dtype: torch.dtype) -> torch.Tensor:
    """What the 32-bit keys must order as the 64-bit ones do, in a half-precision row: the dtype's largest finite
    value beside +inf (bf16's shares FLT_MAX's high 16 bits, what +inf counts as), both signed zeros, -inf, NaN,
    negative values (whose order-preserving bits have ones in the low bits), ties on both sides of block borders and
    a block's last token."""
    x = _logits(4, 1000, 31, dtype=torch.float32, scale=2.0)
    big = torch.finfo(dtype).max
    x[0, 5], x[0, 600], x[0, 7] = big, big, float("inf")
    x[1] = -x[1].abs() - 1.0  # all negative
    x[1, 63], x[1, 64], x[1, 127] = -0.5, -0.5, -0.5
    x[1, 10], x[1, 11] = -0.0, 0.0
    x[2, ::3] = float("-inf")
    x[2, 1::7] = float("nan")
    x[3] = torch.randint(0, 3, (1000,)).float() - 5.0  # ties everywhere, negative
    return x.to(dtype)


@pytest.mark.parametrize("block,group,tl_topk,dtype", [
    (block, group, tl_topk, dtype)
    for block, group, tl_topk in [(64, 1, False), (64, 8, False), (128, 16, False), (64, 8, True), (1024, 8, True)]
    for dtype in (torch.bfloat16, torch.float16)
    if not (tl_topk and block == 64 and dtype == torch.float16)  # ~35 s in the interpreter; fp16's tl.topk at 1024
], ids=lambda v: str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else None)
def test_32_bit_keys_give_the_64_bit_keys(dtype, block, group, tl_topk, monkeypatch):
    # bf16 and fp16 logits rank 32-bit keys in the first pass (key_low_bits); fp32 and KEYS32 off rank 64-bit ones.
    # Both must write the same keys, maxes and sums, and the result must be the reference's; the selections by
    # the interpreter's rounds and by `tl.topk` (the GPU's; slow in the interpreter, so two shapes only, and at
    # 64-token blocks bf16 only).
    if tl_topk:
        import triton.language as tl

        monkeypatch.setattr(kernel, "_TOPK", tl.constexpr(True))
    assert kernel.key_low_bits(dtype, block) == {torch.bfloat16: 16, torch.float16: 13}[dtype]
    assert kernel.key_low_bits(torch.float32, block) == 0 and kernel.key_low_bits(torch.float16, 16384) == 0
    for name, logits, k in (("edges", _half_edges(dtype), 8), ("random, k = 16", _logits(2, 1200, 32, dtype), 16),
                            ("border ties", _border_ties(300, 32).to(dtype), 8)):
        logits = logits.to(DEVICE)
        got = kernel.first_pass(logits, k, block=block, group=group)
        monkeypatch.setattr(kernel, "KEYS32", False)
        assert kernel.key_low_bits(dtype, block) == 0
        want = kernel.first_pass(logits, k, block=block, group=group)
        monkeypatch.setattr(kernel, "KEYS32", True)
        assert torch.equal(got[0][..., :k], want[0][..., :k]), f"{name}: the 32-bit keys' K best differ from the 64-bit"
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), f"{name}: maxes or sums differ"
        _compare(f"{name} {dtype}", logits.cpu(), k, block=block, group=group)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("block,group", [(64, 8), (128, 1)])
def test_selection_by_rounds_gives_the_keys_of_tl_topk(dtype, block, group, monkeypatch):
    # `rounds=True` (ROUNDS): both first-pass selections by K rounds of "max, then drop it" instead of `tl.topk`,
    # with 32-bit (bf16) and 64-bit (fp32) keys; the same K best keys, maxes and sums, and the reference's result.
    # `_TOPK` on, so the default here is `tl.topk` as on the GPU (the interpreter otherwise takes the rounds too).
    import triton.language as tl

    monkeypatch.setattr(kernel, "_TOPK", tl.constexpr(True))
    for name, logits, k in (("edges", _half_edges(torch.bfloat16).to(dtype), 8), ("border ties", _border_ties(300, 32).to(dtype), 8)):
        logits = logits.to(DEVICE)
        want = kernel.first_pass(logits, k, block=block, group=group)
        got = kernel.first_pass(logits, k, block=block, group=group, rounds=True)
        assert torch.equal(got[0][..., :k], want[0][..., :k]), f"{name}: the rounds' K best differ from tl.topk's"
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), f"{name}: maxes or sums differ"
        vals, ids = kernel.topk_logprobs(logits, k, block=block, group=group, rounds=True, num_warps=1)
        want_vals, want_ids = reference.sorted_topk_logprobs(logits.cpu(), k)
        assert torch.equal(ids.cpu(), want_ids), f"{name}: ids differ from the reference's"


def test_real_vocabulary_in_one_pass():
    # Qwen3's V = 151,936 (two depths: the interpreter runs every program in Python).
    _compare("V=151936 bf16", _logits(2, 151_936, 10, torch.bfloat16), 8)


def test_largest_vocabulary_fp32_k16():
    # V = 262,144 = 2^18, the largest: 64 blocks of 4096 (one depth).
    _compare("V=262144 fp32", _logits(1, 262_144, 22), 16)


@pytest.mark.parametrize("block", [2, 4096])
def test_equal_logits_in_a_row_give_bit_equal_logprobs(block):
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, -2.0] * 3])
    vals, ids = kernel.topk_logprobs(logits.to(DEVICE), 4, block=block)
    assert ids.cpu().tolist() == [[1, 2, 4, 7]]
    assert vals[0, 0].item() == vals[0, 1].item() == vals[0, 2].item() == vals[0, 3].item()
    vals, ids = kernel.topk_logprobs(logits[:, :6].to(DEVICE), 4)
    assert ids.cpu().tolist() == [[1, 2, 4, 0]]
    assert vals[0, 0].item() == vals[0, 1].item() == vals[0, 2].item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_nan_logit_has_probability_zero_and_inf_logits_share_the_row(dtype):
    vocab, k = 300, 8
    logits = _nonfinite(5, vocab, 26, dtype)
    vals, ids = kernel.topk_logprobs(logits.to(DEVICE), k, block=64)
    vals, ids = vals.cpu(), ids.cpu().tolist()
    row0 = logits[0].float()
    finite = torch.isfinite(row0).nonzero().flatten().tolist()
    assert ids[0] == sorted(finite, key=lambda t: (-row0[t].item(), t))[:k], "row 0: a NaN token ranked, or the order is off"
    assert torch.isfinite(vals[0]).all()
    assert ids[1][:2] == [7, vocab - 2] and 9 not in ids[1], "row 1: the +inf tokens are not first, or the NaN ranked"
    assert torch.allclose(vals[1, :2], torch.tensor([-0.6931471805599453] * 2, dtype=torch.float64), atol=1e-7)
    assert (vals[1, 2:] < -1e38).all() and torch.isfinite(vals[1, 2:]).all(), "row 1: the finite tokens keep no probability"
    assert ids[2] == list(range(k)) and (vals[2] == float("-inf")).all(), "row 2 (NaN only): not -inf, ids 0 .. K - 1"
    assert ids[3][:3] == [vocab - 1, 1, vocab // 2] and torch.isfinite(vals[3, :3]).all() and (vals[3, 3:] == float("-inf")).all()


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match=r"expected draft_logits \[L, V\]"):
        kernel.topk_logprobs(torch.zeros(4, device=DEVICE), 1)
    with pytest.raises(ValueError, match="expected 1 <= k <= V = 5, got k = 6"):
        kernel.topk_logprobs(torch.zeros(2, 5, device=DEVICE), 6)
    with pytest.raises(ValueError, match="expected fp32, bf16 or fp16 logits, got torch.float64"):
        kernel.topk_logprobs(torch.zeros(2, 5, dtype=torch.float64, device=DEVICE), 2)
    with pytest.raises(ValueError, match="expected block a power of two, got block 0"):
        kernel.topk_logprobs(torch.zeros(2, 5, device=DEVICE), 2, block=0)
    with pytest.raises(ValueError, match="got block 48"):
        kernel.topk_logprobs(torch.zeros(2, 5, device=DEVICE), 2, block=48)
    with pytest.raises(ValueError, match="expected group a power of two, got group 3"):
        kernel.topk_logprobs(torch.zeros(2, 5, device=DEVICE), 2, group=3)


def test_dispatch_takes_the_reference_on_cpu_unless_forced(monkeypatch):
    logits = _logits(2, 50, 11)
    calls = []
    real = kernel.topk_logprobs
    monkeypatch.setattr(kernel, "topk_logprobs", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.delenv("DDTREE_KERNELS", raising=False)
    vals, ids = topk_logprobs.sorted_topk_logprobs(logits, 4)
    assert calls == [] or torch.cuda.is_available() and logits.is_cuda
    monkeypatch.setenv("DDTREE_KERNELS", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "1"))
    if DEVICE == "cpu":
        k_vals, k_ids = topk_logprobs.sorted_topk_logprobs(logits, 4)
        assert calls == [1] and torch.equal(k_ids, ids)
        assert (k_vals - vals).abs().max().item() < TOL
    # float64 logits have no kernel: the reference serves them even when forced.
    topk_logprobs.sorted_topk_logprobs(logits.double(), 4)
    assert len(calls) <= 1


def test_the_engine_does_not_import_triton_on_the_cpu_path():
    # The kernel module (and so triton) is imported lazily: the package import alone must not.
    assert "triton" in sys.modules  # this test file imported it; what matters is the package:
    import ddtree_engine.kernels.topk_logprobs as pkg

    assert "import triton" not in open(pkg.__file__).read()


@gpu
@needs_cuda
@pytest.mark.parametrize(
    "depths,vocab,k,dtype",
    [(15, 151_936, 8, torch.bfloat16), (16, 262_144, 8, torch.float32), (15, 151_936, 1, torch.bfloat16), (7, 32_000, 16, torch.float16)],
)
@pytest.mark.parametrize("group", [1, 8, 32])
def test_real_sizes_on_the_gpu(depths, vocab, k, dtype, group):
    _compare(f"L={depths} V={vocab} k={k} {dtype}", _logits(depths, vocab, 12, dtype), k, group=group)
    _compare(f"tied L={depths} V={vocab}", _tied(depths, vocab, 13).to(dtype), k, group=group)
    _compare(f"border ties L={depths} V={vocab}", _border_ties(vocab, 4096, depths).to(dtype), k, group=group)
    if group > 1:
        _compare(f"group border ties L={depths} V={vocab}", _border_ties(vocab, group, depths).to(dtype), k, group=group)
