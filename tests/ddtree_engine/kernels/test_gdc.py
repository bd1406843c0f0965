"""Programmatic dependent launch (kernels/gdc.py): when it is on, that every step kernel waits for the
kernel before it ahead of any global memory access when it is (in the sm_90 PTX, compiled on any host),
and on the H200 that the step launched with it, in a CUDA graph replayed on new inputs, gives the plain
launches' arrays every time."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")  # tests/ddtree_engine/conftest.py set TRITON_INTERPRET without a GPU

from sm90_compile import compile_in_shards  # noqa: E402
from step_graphs import capture_step  # noqa: E402

from ddtree_engine.kernels import gdc  # noqa: E402
from ddtree_engine.kernels.tree_step import TreeStep, reference_step  # noqa: E402

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_off_on_the_cpu_and_refused_where_it_cannot_run(monkeypatch):
    cpu = torch.zeros(1)
    monkeypatch.delenv(gdc.ENV, raising=False)
    assert gdc.enabled(cpu) is False and gdc.launch_options(cpu) == {"GDC": False}
    assert gdc.enabled(cpu, pdl=False) is False
    with pytest.raises(ValueError, match="compute capability 9.0"):
        gdc.enabled(cpu, pdl=True)
    with pytest.raises(ValueError, match="compute capability 9.0"):
        TreeStep(3, 30, 5, 2, "cpu", pdl=True)
    monkeypatch.setenv(gdc.ENV, "1")  # asks for it where the device can: the CPU cannot, so off
    assert gdc.enabled(cpu) is False and TreeStep(3, 30, 5, 2, "cpu").pdl is False
    monkeypatch.setenv(gdc.ENV, "maybe")
    with pytest.raises(ValueError, match="DDTREE_PDL to be one of 1, true, yes, on, 0, false, no, off"):
        gdc.enabled(cpu)


@needs_cuda
def test_the_environment_turns_it_on_where_the_gpu_can(monkeypatch):
    cuda = torch.zeros(1, device="cuda")
    hopper = torch.cuda.get_device_capability()[0] >= 9
    monkeypatch.delenv(gdc.ENV, raising=False)
    assert gdc.DEFAULT is True and gdc.enabled(cuda) is hopper  # on by default where the GPU can
    monkeypatch.setenv(gdc.ENV, "1")
    assert gdc.enabled(cuda) is hopper and TreeStep(3, 30, 5, 2, "cuda").pdl is hopper
    assert gdc.launch_options(cuda) == ({"GDC": True, "launch_pdl": True} if hopper else {"GDC": False})
    monkeypatch.setenv(gdc.ENV, "0")
    assert gdc.enabled(cuda) is False
    assert TreeStep(3, 30, 5, 2, "cuda").pdl is False


COMPILE_FOR_SM90 = r"""
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ddtree_engine.kernels.topk_logprobs import kernel as topk
from ddtree_engine.kernels.tree_mask import kernel as mask
from ddtree_engine.kernels.tree_walk import kernel as walk

i64, i32 = "*i64", "i32"
first = topk.first_pass_constants(151_936, 8, 4096)
compile_sig = {"par_ptr": i64, "dep_ptr": i64, "n_ptr": i64, "prefix_ptr": i64, "max_depth": i32, "mask_ptr": "*i1",
               "packed_ptr": "*i32", "pos_ptr": i64, "fc_ptr": i64, "ns_ptr": i64, "N": i32, "W": i32}
kernels = {
    "first pass": (topk._chunk_topk, {"logits_ptr": "*bf16", "stride_row": i32, "V": i32, "NCHUNK": i32, "keys_ptr": i64,
                                      "max_ptr": "*fp32", "sum_ptr": "*fp64"},
                   {**{c: first[c] for c in ("K", "KP", "BLOCK", "GROUP")}, "LOWBITS": topk.key_low_bits(torch.bfloat16, 4096),
                    "ROUNDS": False}, 4),
    "merge": (topk._merge_topk, {"keys_ptr": i64, "max_ptr": "*fp32", "sum_ptr": "*fp64", "NCHUNK": i32, "vals_ptr": "*fp64",
                                 "ids_ptr": i64}, {c: first[c] for c in ("K", "KP", "CP", "BLOCK")}, 1),
    "compile": (mask._compile_tree, compile_sig, {**mask.launch_constants(16), "GATHER": False}, 4),
    # 65 rows: the climb by gather (mask.climbs_by_gather), its one parent load before the climb
    "compile by gather": (mask._compile_tree, compile_sig, {**mask.launch_constants(65), "GATHER": True}, 4),
    "walk": (walk._walk, {"tok_ptr": i64, "par_ptr": i64, "n_ptr": i64, "choice_ptr": i64, "max_depth": i32, "path_ptr": i64,
                          "emit_ptr": i64, "len_ptr": i64, "bonus_ptr": i64, "N": i32}, {"NP": 16}, 4),
    "walk by jumps": (walk._walk_jumps, {"tok_ptr": i64, "par_ptr": i64, "n_ptr": i64, "choice_ptr": i64, "path_ptr": i64,
                                         "emit_ptr": i64, "len_ptr": i64, "bonus_ptr": i64, "N": i32},
                      {"NP": 16, "LOGN": 4, "DEDUPE": False}, 1),
    # the largest it takes, with the first-match compare (walk_arrays' default for callers other than TreeStep)
    "walk by jumps, dedupe": (walk._walk_jumps, {"tok_ptr": i64, "par_ptr": i64, "n_ptr": i64, "choice_ptr": i64,
                                                 "path_ptr": i64, "emit_ptr": i64, "len_ptr": i64, "bonus_ptr": i64, "N": i32},
                              {"NP": 64, "LOGN": 6, "DEDUPE": True}, 1),
}
for name, (fn, sig, consts, warps) in kernels.items():
    for on in (True, False):
        if not mine():  # sm90_compile.SHARD_ARGS
            continue
        cs = dict(consts, GDC=on)
        src = ASTSource(fn=fn, signature={**sig, **{c: "constexpr" for c in cs}}, constexprs=cs)
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]
        body = ptx[ptx.index(".entry"):]
        wait = body.find("griddepcontrol.wait")
        touch = min(i for i in (body.find(op) for op in ("ld.global", "st.global", "atom.global")) if i >= 0)
        print(name, on, wait >= 0, "griddepcontrol.launch_dependents" in body, 0 <= wait < touch)
"""


def test_each_kernel_waits_before_touching_memory_in_the_h200_code():
    """With GDC each kernel's sm_90 code has the wait ahead of its first global load, store or atomic and
    lets the next kernel launch; without it, neither instruction (the build kernels' and the one-launch
    kernel's compile tests check their wait too). In child processes sharing the 14 compiles (sm90_compile): the
    kernels here are the interpreter's."""
    lines = compile_in_shards(COMPILE_FOR_SM90, timeout_s=600)
    for name in ("first pass", "merge", "compile", "compile by gather", "walk", "walk by jumps", "walk by jumps, dedupe"):
        assert f"{name} True True True True" in lines, lines
        assert f"{name} False False False False" in lines, lines


@gpu
@needs_cuda
@pytest.mark.parametrize("budget,fused", [(15, False), (15, True), (64, False), (256, False)])
def test_a_dependent_launch_step_replays_as_the_plain_one(budget, fused):
    """The step with PDL and the same step with plain launches, each captured once in a CUDA graph; on 24
    new inputs (logits, root, prefix, the target's choices copied in between replays, half of them tied
    logits) both replays give the same arrays, and the PDL one's tree is the reference's on its own top-K
    table. A kernel reading before the one ahead of it has written (a wait missing) reads the previous
    replay's arrays and fails here."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs compute capability 9.0 (Hopper) for programmatic dependent launch")
    depths, vocab, topk = 15, 151_936, 8
    steps = [TreeStep(depths, vocab, budget, topk, "cuda", fused=fused, pdl=pdl) for pdl in (True, False)]
    assert [s.pdl for s in steps] == [True, False]
    logits = torch.zeros(depths, vocab, dtype=torch.bfloat16, device="cuda")
    root = torch.zeros(1, dtype=torch.long, device="cuda")
    prefix = torch.zeros(1, dtype=torch.long, device="cuda")
    choices = torch.zeros(steps[0].num_rows, dtype=torch.long, device="cuda")
    graphs = [capture_step(step, logits, root, prefix, choices) for step in steps]
    gen = torch.Generator(device="cuda").manual_seed(3)
    for replay in range(24):
        if replay % 2:
            logits.copy_(torch.randint(0, 4, (depths, vocab), device="cuda", generator=gen).to(torch.bfloat16))
        else:
            logits.copy_((torch.randn(depths, vocab, device="cuda", generator=gen) * 3).to(torch.bfloat16))
        root.fill_(7 + replay)
        prefix.fill_(100 * replay)
        choices.copy_(torch.randint(0, vocab, (choices.shape[0],), device="cuda", generator=gen))
        choices[0] = logits[0].float().argmax()  # the walk accepts at least the best first token
        outputs = []
        for graph, step in zip(graphs, steps):
            graph.replay()
            torch.cuda.synchronize()
            outputs.append([t.clone() for t in (step.vals, step.ids) + step.tree + step.compiled + step.walked])
        for i, (got, want) in enumerate(zip(*outputs)):
            assert torch.equal(got, want), f"replay {replay}: array {i} differs between PDL and plain launches"
        want_tree, want_compiled, _ = reference_step(logits, budget, topk, 7 + replay, 100 * replay, None,
                                                     topk_table=(steps[0].vals, steps[0].ids))
        for i, (got, want) in enumerate(zip(steps[0].tree[:4] + steps[0].compiled, want_tree[:4] + want_compiled)):
            assert torch.equal(got.cpu(), want), f"replay {replay}: array {i} differs from the reference"
