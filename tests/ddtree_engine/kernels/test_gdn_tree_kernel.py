"""The Triton Gated-DeltaNet tree kernels (kernels/gdn_tree/kernel.py) against their PyTorch
reference: the parent-indexed causal conv, the gated delta recurrence with every node's state
taken from its parent (all nodes in one launch), and the commit gather, on every tree shape.

On a CPU host the kernels run in Triton's interpreter (small, odd sizes); on a GPU the same
tests run natively, and the `gpu`-marked ones add Qwen3.5-27B-class sizes (value heads 48, key
heads 16, dims 128, bf16 inputs, fp32 state) and a CUDA-graph capture of verify + commit.
"""

from __future__ import annotations

import pytest
import torch

from engine_oracle import OracleDrafter, rule_deep, run

from tree_shapes import depth_major, kary, random_tree
from ddtree_engine.core.hybrid import conv_window_index, l2norm
from ddtree_engine.kernels import gdn_tree
from ddtree_engine.reference.engine import load_engine
from ddtree_engine.types import SpeculativeConfig

pytest.importorskip("triton")
# Without a GPU, tests/ddtree_engine/conftest.py has set TRITON_INTERPRET=1 before triton loaded.
from ddtree_engine.kernels.gdn_tree import kernel, reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


SHAPES = {
    "single node": [-1],
    "chain": list(range(-1, 7)),
    "star (depth 1)": [-1, 0, 0, 0, 0, 0],
    "full binary": kary(2, 15),
    "full ternary": kary(3, 13),
    "random 17": random_tree(17, 0),
    "random 17 depth-major": depth_major(random_tree(17, 3)),
    "chain then fork": [-1, 0, 1, 2, 2, 4, 3],
    "two roots": [-1, 0, -1, 2, 1],
}


def _path(parents: list[int], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def _assert_close(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    diff = (got.double() - want.double()).abs()
    max_abs = diff.max().item() if diff.numel() else 0.0
    rel = (diff.norm() / want.double().norm().clamp_min(1e-30)).item()
    assert rel <= rtol and max_abs <= atol, (
        f"{what}: relative error {rel:.3e} (limit {rtol:.0e}), max abs diff {max_abs:.3e} (limit {atol:.0e})"
    )


def _assert_bf16_rounding(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """`got` is `want` (exact) rounded to bf16 once: within one bf16 ulp (2**-7 relative) everywhere."""
    assert got.dtype == torch.bfloat16, f"{what}: dtype {got.dtype}"
    diff = (got.double() - want.double()).abs()
    bound = want.double().abs() * 2**-7 + 2**-12
    worst = (diff / bound).max().item()
    rel = (diff.norm() / want.double().norm()).item()
    assert worst <= 1.0, (
        f"{what}: max abs diff {diff.max().item():.3e} exceeds one bf16 ulp (worst {worst:.2f} ulp), relative error {rel:.3e}"
    )


# Tolerances per state dtype: the kernel reduces over Dk in another order than torch does.
TOL = {torch.float32: (2e-6, 2e-5), torch.float64: (1e-13, 1e-12)}


def _gdn_inputs(t, h, hk, dk, dv, input_dtype, state_dtype, seed, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q = (l2norm(rnd(t, hk, dk)) * dk**-0.5).to(device, input_dtype)
    k = l2norm(rnd(t, hk, dk)).to(device, input_dtype)
    v = rnd(t, h, dv).to(device, input_dtype)
    g = (-torch.rand(t, h, generator=gen, dtype=torch.float64) * 2).to(device, torch.float32)
    beta = torch.rand(t, h, generator=gen, dtype=torch.float64).to(device, input_dtype)
    s0 = rnd(h, dk, dv).to(device, state_dtype)
    return q, k, v, g, beta, s0


def _check_recurrence(parents, h, hk, dk, dv, input_dtype, state_dtype, seed, block_v=None, device=DEVICE):
    t = len(parents)
    q, k, v, g, beta, s0 = _gdn_inputs(t, h, hk, dk, dv, input_dtype, state_dtype, seed, device)
    par = torch.tensor(parents, dtype=torch.int32, device=device)
    out, states = kernel.gated_delta_tree(q, k, v, g, beta, par, s0, keep_states=True, block_v=block_v)
    ref_out, ref_states = reference.gated_delta_tree(q, k, v, g, beta, parents, s0, keep_states=True)
    rtol, atol = TOL[state_dtype]
    assert out.dtype == state_dtype and states.dtype == state_dtype
    _assert_close(out, ref_out, rtol, atol, f"out, parents {parents}")
    _assert_close(states, ref_states, rtol, atol, f"states, parents {parents}")


@pytest.mark.parametrize("shape", list(SHAPES))
def test_recurrence_matches_reference_on_every_tree_shape(shape):
    # Odd head count and dims; Dv 7 over blocks of 4 also checks the value-block masking.
    _check_recurrence(SHAPES[shape], h=3, hk=3, dk=5, dv=7, input_dtype=torch.float32,
                      state_dtype=torch.float32, seed=len(shape), block_v=4)


@pytest.mark.parametrize("shape", ["full binary", "random 17 depth-major", "two roots"])
def test_recurrence_with_grouped_key_heads_matches_reference(shape):
    # 6 value heads over 2 key heads (ratio 3): value head h reads key head h // 3.
    _check_recurrence(SHAPES[shape], h=6, hk=2, dk=4, dv=6, input_dtype=torch.float32,
                      state_dtype=torch.float32, seed=11)


@pytest.mark.parametrize("input_dtype,state_dtype", [(torch.bfloat16, torch.float32), (torch.float64, torch.float64)])
def test_recurrence_in_model_dtypes(input_dtype, state_dtype):
    # bf16 q/k/v with the fp32 state the target keeps; fp64 throughout (the CPU engine tests' models).
    _check_recurrence(SHAPES["random 17"], h=5, hk=5, dk=8, dv=9, input_dtype=input_dtype,
                      state_dtype=state_dtype, seed=5)


def test_each_node_state_is_a_sequential_run_over_its_own_path():
    """The definition, not just the reference: node i's state is the chain recurrence along the
    root-to-i path, so a sibling never sees its sibling's update."""
    parents = SHAPES["full ternary"]
    q, k, v, g, beta, s0 = _gdn_inputs(len(parents), 3, 3, 4, 5, torch.float64, torch.float64, seed=2)
    out, states = kernel.gated_delta_tree(q, k, v, g, beta, torch.tensor(parents, device=DEVICE), s0, True)
    for node in range(len(parents)):
        idx = _path(parents, node)
        chain_out, chain_state = kernel.gated_delta_tree(q[idx], k[idx], v[idx], g[idx], beta[idx], None, s0, False)
        _assert_close(out[node], chain_out[-1], 1e-13, 1e-12, f"out of node {node}")
        _assert_close(states[node], chain_state[0], 1e-13, 1e-12, f"state of node {node}")


def test_chain_mode_equals_the_tree_path_on_a_chain_and_the_reference():
    parents = list(range(-1, 9))
    q, k, v, g, beta, s0 = _gdn_inputs(len(parents), 4, 2, 6, 5, torch.float32, torch.float32, seed=3)
    tree_out, tree_states = kernel.gated_delta_tree(q, k, v, g, beta, torch.tensor(parents, device=DEVICE), s0, True)
    chain_out, chain_states = kernel.gated_delta_tree(q, k, v, g, beta, None, s0, True)
    last_out, last_state = kernel.gated_delta_tree(q, k, v, g, beta, None, s0, False)
    # Same arithmetic in the same order: bitwise equal.
    assert torch.equal(tree_out, chain_out) and torch.equal(tree_states, chain_states)
    assert torch.equal(last_out, chain_out) and torch.equal(last_state[0], chain_states[-1])
    ref_out, ref_last = reference.gated_delta_tree(q, k, v, g, beta, parents, s0, keep_states=False)
    _assert_close(last_out, ref_out, *TOL[torch.float32], "linear out")
    _assert_close(last_state, ref_last, *TOL[torch.float32], "linear last state")


def _conv_inputs(t, c, ksize, dtype, seed, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, c, generator=gen, dtype=torch.float64).to(device, dtype)
    committed = torch.randn(ksize - 1, c, generator=gen, dtype=torch.float64).to(device, dtype)
    weight = torch.randn(c, ksize, generator=gen, dtype=torch.float64).to(device, dtype)
    bias = torch.randn(c, generator=gen, dtype=torch.float64).to(device, dtype)
    return x, committed, weight, bias


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("ksize", [2, 4])
def test_conv_matches_reference_on_every_tree_shape(shape, ksize):
    parents = SHAPES[shape]
    x, committed, weight, bias = _conv_inputs(len(parents), 11, ksize, torch.float32, seed=ksize)
    index = conv_window_index(parents, ksize).to(DEVICE)
    for b in (bias, None):
        got = kernel.tree_causal_conv(x, committed, weight, b, index, block_c=4)  # 11 channels: 3 blocks, last partial
        want = reference.tree_causal_conv(x, committed, weight, b, index)
        _assert_close(got, want, 2e-6, 1e-5, f"conv K={ksize} bias={b is not None} parents {parents}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_conv_in_model_dtypes(dtype):
    parents = SHAPES["random 17 depth-major"]
    x, committed, weight, bias = _conv_inputs(len(parents), 9, 4, dtype, seed=7)
    index = conv_window_index(parents, 4).to(DEVICE)
    got = kernel.tree_causal_conv(x, committed, weight, bias, index)
    assert got.dtype == dtype
    # Truth in fp64 from the same inputs: the kernel accumulates wide and rounds once.
    want = reference.tree_causal_conv(x.double(), committed.double(), weight.double(), bias.double(), index)
    if dtype == torch.bfloat16:
        _assert_bf16_rounding(got, want, "conv bf16")
    else:
        _assert_close(got, want, 1e-14, 1e-13, "conv fp64")


def test_conv_chain_mode_equals_the_indexed_path_on_a_chain():
    parents = list(range(-1, 6))
    x, committed, weight, bias = _conv_inputs(len(parents), 10, 4, torch.float32, seed=8)
    index = conv_window_index(parents, 4).to(DEVICE)
    assert torch.equal(
        kernel.tree_causal_conv(x, committed, weight, bias, None),
        kernel.tree_causal_conv(x, committed, weight, bias, index),
    )


@pytest.mark.parametrize("ksize", [2, 4])
def test_commit_gathers_the_accepted_nodes_state_and_window(ksize):
    parents = SHAPES["random 17 depth-major"]
    t, h, dk, dv, c = len(parents), 3, 4, 5, 13
    gen = torch.Generator().manual_seed(9)
    states = torch.randn(t, h, dk, dv, generator=gen).to(DEVICE)
    x, committed, _, _ = _conv_inputs(t, c, ksize, torch.float32, seed=ksize)
    index = conv_window_index(parents, ksize).to(DEVICE)
    # Every node, including the root (whose window still reads the committed rows it overwrites)
    # and a node given as a device tensor.
    for node in range(t):
        got_state = torch.zeros(h, dk, dv, device=DEVICE)
        got_window = committed.clone()
        want_state = torch.zeros(h, dk, dv, device=DEVICE)
        want_window = committed.clone()
        which = torch.tensor([node], device=DEVICE) if node % 2 else node
        kernel.commit_gdn_state(states, which, got_state, x, index, got_window, block=16, block_c=4)
        reference.commit_gdn_state(states, node, want_state, x, index, want_window)
        assert torch.equal(got_state, want_state), f"state of node {node}"
        assert torch.equal(got_window, want_window), f"window of node {node} (K={ksize})"
        # The window is the newest K-1 inputs of the node's path, committed rows first.
        seq = torch.cat([committed, x[_path(parents, node)]])
        assert torch.equal(got_window, seq[-(ksize - 1):]), f"window of node {node} is not its path's"


def test_launchers_refuse_bad_shapes():
    q, k, v, g, beta, s0 = _gdn_inputs(4, 4, 2, 3, 3, torch.float32, torch.float32, seed=0)
    with pytest.raises(ValueError, match="key heads dividing value heads"):
        kernel.gated_delta_tree(q[:, :1].repeat(1, 3, 1), k[:, :1].repeat(1, 3, 1), v, g, beta, None, s0, True)
    with pytest.raises(ValueError, match=r"expected integer parents \[4\]"):
        kernel.gated_delta_tree(q, k, v, g, beta, torch.zeros(3, dtype=torch.int32), s0, True)
    with pytest.raises(ValueError, match="fp32 or fp64 state"):
        kernel.gated_delta_tree(q, k, v, g, beta, None, s0.half(), True)
    x, committed, weight, bias = _conv_inputs(4, 6, 4, torch.float32, seed=0)
    with pytest.raises(ValueError, match=r"expected committed_window \[3, 6\]"):
        kernel.tree_causal_conv(x, committed[:2], weight, bias, None)
    with pytest.raises(ValueError, match="expected state_out"):
        kernel.commit_gdn_state(s0.unsqueeze(0), 0, s0[:2].clone(), x, conv_window_index([-1] * 4, 4), committed.clone())


# ---- dispatch: what the engine calls ------------------------------------------------------------


def _force_kernels(monkeypatch) -> None:
    """Route the engine's GDN calls to the kernels on this host's DEVICE tensors: on a GPU the
    default rule does (CUDA tensors), on a CPU host the interpreter, forced."""
    if DEVICE == "cuda":
        monkeypatch.delenv("DDTREE_KERNELS", raising=False)
    else:
        monkeypatch.setenv("DDTREE_KERNELS", "triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_dispatch_follows_the_device_and_the_env(monkeypatch):
    calls = []
    real = kernel.gated_delta_tree
    monkeypatch.setattr(kernel, "gated_delta_tree", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    parents = SHAPES["full binary"]
    q, k, v, g, beta, s0 = _gdn_inputs(len(parents), 3, 3, 4, 4, torch.float32, torch.float32, seed=1, device="cpu")
    monkeypatch.delenv("DDTREE_KERNELS", raising=False)
    ref = gdn_tree.gated_delta_tree(q, k, v, g, beta, parents, s0, True)
    assert calls == [] and gdn_tree.use_kernel(q) is False  # CPU behaviour is the reference's
    dev = [t.to(DEVICE) for t in (q, k, v, g, beta, s0)]
    if DEVICE == "cuda":
        assert gdn_tree.use_kernel(dev[0]) is True  # CUDA: the kernel unless told otherwise
    else:
        _force_kernels(monkeypatch)
    got = gdn_tree.gated_delta_tree(*dev[:5], parents, dev[5], True)
    assert calls == [1]
    _assert_close(got[1].cpu(), ref[1], *TOL[torch.float32], "dispatched states")
    monkeypatch.setenv("DDTREE_KERNELS", "reference")
    assert gdn_tree.use_kernel(dev[0]) is False
    monkeypatch.setenv("DDTREE_KERNELS", "fast")
    with pytest.raises(ValueError, match="reference, triton or auto"):
        gdn_tree.use_kernel(q)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_dispatch_keeps_the_references_refusals(monkeypatch, backend):
    monkeypatch.setenv("DDTREE_KERNELS", backend)
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v, g, beta, s0 = _gdn_inputs(3, 2, 2, 4, 4, torch.float32, torch.float32, seed=1)
    with pytest.raises(ValueError, match="linear"):
        gdn_tree.gated_delta_tree(q, k, v, g, beta, [-1, 0, 0], s0, keep_states=False)
    if backend == "triton":  # the kernel reads parents blindly: the dispatcher checks the order
        with pytest.raises(ValueError, match="node 1 with parent 2"):
            gdn_tree.gated_delta_tree(q, k, v, g, beta, [-1, 2, 0], s0, keep_states=True)


@pytest.fixture(scope="module")
def hybrid_runner(engines, tiny_pairs):
    """The tiny hybrid target in fp64: the session's CPU engine, or the same weights on the GPU."""
    if DEVICE == "cpu":
        return engines["qwen3-next"]
    target, draft = tiny_pairs["qwen3-next"]
    return load_engine(str(target), str(draft), SpeculativeConfig("ddtree"), device="cuda", dtype="float64")


def _verify_and_commit(runner, parents, backend, monkeypatch):
    """Prefill, verify a tree and commit its deepest node through the engine's TargetRunner."""
    if backend == "triton":
        _force_kernels(monkeypatch)
    else:
        monkeypatch.setenv("DDTREE_KERNELS", backend)
    gen = torch.Generator().manual_seed(4)
    cache = runner.new_cache()
    prompt = torch.randint(0, runner.vocab_size, (6,), generator=gen)
    pre = runner.forward(cache, prompt, torch.arange(-1, 5), torch.arange(6), linear=True)
    runner.commit(cache, pre, list(range(6)))
    depth = [0] * len(parents)
    for i, p in enumerate(parents):
        depth[i] = 0 if p < 0 else depth[p] + 1
    tokens = torch.randint(0, runner.vocab_size, (len(parents),), generator=gen)
    out = runner.forward(cache, tokens, torch.tensor(parents), torch.tensor(depth))
    runner.commit(cache, out, _path(parents, max(range(len(parents)), key=depth.__getitem__)))
    return out, cache


def test_target_verify_forward_and_commit_match_the_reference(hybrid_runner, monkeypatch):
    """The reference target's verify forward on a depth-major tree, dispatched to the kernels:
    same logits and per-node GDN states as with the references, same cache after the commit."""
    runner = hybrid_runner.runner
    parents = SHAPES["random 17 depth-major"]
    want, want_cache = _verify_and_commit(runner, parents, "reference", monkeypatch)
    got, got_cache = _verify_and_commit(runner, parents, "triton", monkeypatch)
    _assert_close(got.logits, want.logits, 1e-12, 1e-10, "verify logits")
    gdn = [i for i, pend in enumerate(want.pending) if pend.states is not None]
    assert gdn, "the tiny hybrid target has no Gated-DeltaNet layer"
    for i in gdn:
        _assert_close(got.pending[i].states, want.pending[i].states, 1e-12, 1e-10, f"layer {i} node states")
        _assert_close(got_cache.layers[i].state, want_cache.layers[i].state, 1e-12, 1e-10, f"layer {i} cache state")
        assert torch.equal(got_cache.layers[i].window, want_cache.layers[i].window), f"layer {i} cache window"


def _second_sibling(step: int, depth: int) -> int:
    # The truth always ranks second: every accepted node sits after a wrong sibling in flattened
    # order, the case where a sibling's leaked state changes this tiny target's tokens at once.
    return 1


def test_engine_is_lossless_with_the_kernels(hybrid_runner, monkeypatch):
    """The hybrid reference engine with every GDN call on the kernels (interpreter on a CPU host:
    prefill in chain mode, tree verify, chain verify) emits ar's tokens (ar measured on the
    references) for ddtree accepting second siblings and for dflash accepting a whole block."""
    engine = hybrid_runner
    prompt, max_new = [60, 9, 200, 33, 101], 10
    monkeypatch.setenv("DDTREE_KERNELS", "reference")
    truth = run(engine, prompt, SpeculativeConfig("ar"), max_new).token_ids
    calls = []
    real = kernel.gated_delta_tree
    monkeypatch.setattr(kernel, "gated_delta_tree", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    _force_kernels(monkeypatch)
    cases = [
        ("ddtree second siblings", SpeculativeConfig("ddtree", 15, 2), _second_sibling, 0.7, 4),
        ("dflash deep", SpeculativeConfig("dflash"), rule_deep, 6.0, 8),
    ]
    for name, spec, rule, spacing, accepted in cases:
        drafter = OracleDrafter(prompt + truth, engine.runner.vocab_size, rule, seed=3, spacing=spacing)
        result = run(engine, prompt, spec, max_new, drafter=drafter)
        assert result.token_ids == truth, name
        assert sum(s.accepted_drafts for s in result.steps) >= accepted, f"{name}: {[s.accepted_drafts for s in result.steps]}"
    assert calls, "the kernels were never called"


# ---- GPU: Qwen3.5-27B-class sizes ---------------------------------------------------------------

BIG = dict(h=48, hk=16, dk=128, dv=128)
BIG_SHAPES = {
    "single node": [-1],
    "chain 16": list(range(-1, 15)),
    "star 16": [-1] + [0] * 15,
    "binary 16": kary(2, 16),
    "4-ary 16": kary(4, 16),
    "random 16": depth_major(random_tree(16, 4)),
    "random 65": depth_major(random_tree(65, 5)),
}


@gpu
@needs_cuda
@pytest.mark.parametrize("shape", list(BIG_SHAPES))
def test_gpu_recurrence_at_qwen35_27b_sizes(shape):
    _check_recurrence(BIG_SHAPES[shape], input_dtype=torch.bfloat16, state_dtype=torch.float32, seed=1, **BIG)


@gpu
@needs_cuda
@pytest.mark.parametrize("shape", list(BIG_SHAPES))
def test_gpu_conv_at_qwen35_27b_sizes(shape):
    parents = BIG_SHAPES[shape]
    c = 2 * 16 * 128 + 48 * 128  # q, k (16 key heads) and v (48 value heads), dims 128
    x, committed, weight, bias = _conv_inputs(len(parents), c, 4, torch.bfloat16, seed=2)
    index = conv_window_index(parents, 4).to(DEVICE)
    got = kernel.tree_causal_conv(x, committed, weight, bias, index)
    want = reference.tree_causal_conv(x.double(), committed.double(), weight.double(), bias.double(), index)
    _assert_bf16_rounding(got, want, f"conv {shape}")


@gpu
@needs_cuda
def test_gpu_verify_and_commit_replay_in_a_cuda_graph():
    """Verify (conv + recurrence over a device parents array) and commit of a device-side node
    index, captured once and replayed on new inputs: no host synchronisation anywhere."""
    parents = BIG_SHAPES["random 16"]
    t, c = len(parents), 2 * 16 * 128 + 48 * 128
    q, k, v, g, beta, s0 = _gdn_inputs(t, **BIG, input_dtype=torch.bfloat16, state_dtype=torch.float32, seed=3)
    x, committed, weight, bias = _conv_inputs(t, c, 4, torch.bfloat16, seed=3)
    par = torch.tensor(parents, dtype=torch.int32, device=DEVICE)
    index = conv_window_index(parents, 4).to(DEVICE)
    node = torch.tensor([0], device=DEVICE)
    deepest = reference.node_levels(parents)[-1][0]
    cache_state, cache_window = s0.clone(), committed.clone()

    def step():
        conv = kernel.tree_causal_conv(x, cache_window, weight, bias, index)
        out, states = kernel.gated_delta_tree(q, k, v, g, beta, par, cache_state, True)
        kernel.commit_gdn_state(states, node, cache_state, x, index, cache_window)
        return conv, out

    step()  # compile outside the capture
    cache_state.copy_(s0)
    cache_window.copy_(committed)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        conv, out = step()
    for trial in range(2):
        new = _gdn_inputs(t, **BIG, input_dtype=torch.bfloat16, state_dtype=torch.float32, seed=10 + trial)
        for dst, src in zip((q, k, v, g, beta, s0), new):
            dst.copy_(src)
        x.copy_(torch.randn_like(x))
        cache_state.copy_(s0)
        cache_window.copy_(committed)
        node.fill_(deepest if trial == 0 else 2)  # the deepest node, then a depth-1 sibling
        graph.replay()
        want_conv = reference.tree_causal_conv(x.double(), committed.double(), weight.double(), bias.double(), index)
        want_out, want_states = reference.gated_delta_tree(q, k, v, g, beta, parents, s0, True)
        _assert_bf16_rounding(conv, want_conv, f"graph conv, trial {trial}")
        _assert_close(out, want_out, *TOL[torch.float32], f"graph out, trial {trial}")
        last = int(node.item())
        _assert_close(cache_state, want_states[last], *TOL[torch.float32], f"committed state, trial {trial}")
        want_window = committed.clone()
        reference.commit_gdn_state(want_states, last, torch.empty_like(s0), x, index, want_window)
        assert torch.equal(cache_window, want_window), f"committed window, trial {trial}"
