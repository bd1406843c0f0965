"""kernels/tree_conv_update against SGLang 0.5.23's own tree conv update, and the plugin's router to it.

SGLang's `causal_conv1d_update` (its Triton kernel, tree path) and the engine's kernel run on the same inputs:
trees with parents before children and pad rows without links, as DDTREE lays them out, several requests with their cache lines
and intermediate-window lines, a pad slot; every array SGLang writes must come out the same, bit for bit:
the outputs, the cache lines' conv state, every row's window, the parents. On a CPU host both kernels run in
Triton's interpreter (tests/ddtree_engine/conftest.py), in fp32 and fp16: the interpreter rounds fp32 to bf16
wrongly when it stores (both kernels' bf16 outputs come out as the same wrong numbers), so bf16 is for the GPU
(there these tests run natively, and benchmarks/sglang_h200/conv_verify_kernel.py in bf16).
"""

from __future__ import annotations

import inspect
import random

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _bool_masks(interpreter_bool_masks):
    """SGLang's kernel runs in Triton's interpreter here only with its masks cast to bool (conftest.py)."""


def _tree(rows: int, nodes: int, rng: random.Random, fan: int) -> tuple[list[int], list[int]]:
    """Links of a random tree of `nodes` rows, parents before children (DDTREE's depth-major rows are one such
    order), padded to `rows` as the plugin pads (pad rows: no links, nobody's child)."""
    from ddtree_engine.kernels.tree_mask.reference import compile_tree_arrays

    parents = [-1] + [rng.randrange(max(0, i - fan), i) for i in range(1, nodes)]
    padded = torch.tensor(parents + [-1] * (rows - nodes))
    _, _, _, first, sibling = compile_tree_arrays(padded, torch.zeros(rows, dtype=torch.long), nodes, 0)
    return first.tolist(), sibling.tolist()


def inputs(batch, rows, channels, width, dtype, seed, *, fan=4, pad_slot_at=None):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    lines = batch + 3
    links = [_tree(rows, rng.randint(1, rows), rng, fan) for _ in range(batch)]
    rnd = lambda *shape: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    state_lines = torch.tensor(rng.sample(range(lines), batch), dtype=torch.int32)
    if pad_slot_at is not None:
        state_lines[pad_slot_at] = -1
    return dict(
        x=rnd(batch, rows, channels).transpose(1, 2),  # the GDN backend's transposed view
        conv_state=rnd(lines, width - 1, channels).transpose(1, 2),  # SGLang's pool: channels contiguous
        weight=rnd(channels, width),
        bias=rnd(channels),
        activation="silu",
        conv_state_indices=state_lines,
        intermediate_conv_window=torch.zeros(lines, rows, channels, width - 1, dtype=dtype),
        intermediate_state_indices=torch.tensor(rng.sample(range(lines), batch), dtype=torch.int32),
        retrieve_next_token=torch.tensor([f for f, _ in links], dtype=torch.long),
        retrieve_next_sibling=torch.tensor([s for _, s in links], dtype=torch.long),
        retrieve_parent_token=torch.full((batch, rows), -7, dtype=torch.long),
    )


def copies(args: dict) -> dict:
    """args with every tensor copied to DEVICE (strides kept: clone and .to preserve them)."""
    return {k: (v.clone().to(DEVICE) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


def call(fn, args):
    """fn on copies of args on DEVICE; the arrays SGLang writes."""
    mine = copies(args)
    out = fn(**mine)
    written = (out, mine["conv_state"], mine["intermediate_conv_window"], mine.get("retrieve_parent_token", out))
    return [t.cpu() for t in written]


def sglang_update():
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

    return causal_conv1d_update


def engine_update(**kw):
    from ddtree_engine.kernels.tree_conv_update.kernel import tree_conv_update

    activation = kw.pop("activation")
    return tree_conv_update(silu=activation == "silu", **kw)


def assert_identical(ours, theirs, skip=()):
    keep = [b for b in range(ours[0].shape[0]) if b not in skip]
    for name, a, b in zip(("out", "conv_state", "windows", "parents"), ours, theirs):
        if name in ("out", "parents"):
            a, b = a[keep], b[keep]
        assert torch.equal(a, b), f"{name}: max |diff| {(a.double() - b.double()).abs().max()}"


DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("rows", [1, 2, 5, 16, 33])
def test_the_engine_kernel_writes_sglangs_arrays_bit_for_bit(rows, width, dtype):
    args = inputs(3, rows, 40, width, dtype, seed=rows * 10 + width, pad_slot_at=1)
    assert_identical(call(engine_update, args), call(sglang_update(), args), skip=(1,))


@pytest.mark.parametrize("channels", [300, 1000])
def test_several_channel_blocks_a_request(channels):
    """More channels than one program takes (128 in the engine's, 256 in SGLang's): every block's scratch, its
    channels of the state line and windows, and the parents written once."""
    args = inputs(2, 20, channels, 4, torch.float16, seed=channels, pad_slot_at=0)
    assert_identical(call(engine_update, args), call(sglang_update(), args), skip=(0,))


@pytest.mark.parametrize("fan", [1, 8, 40])
def test_wide_trees_chains_and_fans_at_budget_128(fan):
    """129 rows (budget 128): a chain (fan 1), topk-8-like fans, and 40-wide sibling chains."""
    args = inputs(2, 129, 24, 4, torch.float32, seed=fan, fan=fan)
    assert_identical(call(engine_update, args), call(sglang_update(), args))


def test_the_router_sends_tree_calls_to_the_engine_kernel_and_the_rest_to_sglang(sglang_plugin, monkeypatch):
    from ddtree_engine.sglang_plugin import tree_conv

    monkeypatch.setenv("DDTREE_KERNELS", "reference")  # the router calls the kernel itself, whatever this says
    original = sglang_update()
    routed = tree_conv.router(original)
    # SGLang's GDN backend calls it by these names: the router takes them all, in SGLang's order.
    assert list(inspect.signature(routed).parameters) == list(inspect.signature(original).parameters)

    args = inputs(2, 17, 24, 4, torch.float32, seed=1)
    assert_identical(call(routed, args), call(original, args))
    assert routed.engine_calls == 1
    # A chain verify (DFLASH, or DDTREE's unsafe mode): no links, SGLang's kernel serves it.
    chain = {k: v for k, v in args.items() if not k.startswith("retrieve_")}
    assert_identical(call(routed, chain)[:3], call(original, chain)[:3])
    assert routed.engine_calls == 1


def test_the_first_gdn_layer_of_a_forward_finds_the_parents_and_the_later_ones_take_them(sglang_plugin, caplog):
    """One verify forward as SGLang's backend runs it: every layer its own x, weights and state, the same links and
    the same retrieve_parent_token; with parents_once, under layer_scope the lowest layer finds the parents and the
    others take them (install's default, PARENTS_ONCE); without it every layer finds them."""
    from types import SimpleNamespace

    from ddtree_engine.sglang_plugin import tree_conv

    original = sglang_update()
    routed = tree_conv.router(original, parents_once=True)
    shared = inputs(2, 17, 24, 4, torch.float32, seed=3)
    # Request 1 in a pad slot (-1 cache line in every layer, as SGLang's cache_indices): no parents written for it
    # by the first layer, and none read by the later ones.
    layers = {lid: {**inputs(2, 17, 24, 4, torch.float32, seed=lid, pad_slot_at=1),
                    **{k: v for k, v in shared.items() if k.startswith("retrieve_")}}
              for lid in (4, 9, 13)}

    def forward(fn, scoped: bool, parents: torch.Tensor):
        outs = []
        for lid, args in layers.items():
            mine = copies(args)
            mine["retrieve_parent_token"] = parents  # one tensor for the whole forward
            def run(self, layer, **kw):
                return fn(**kw)

            if scoped:
                run = tree_conv.layer_scope(run)
            out = run(None, layer=SimpleNamespace(layer_id=lid), **mine)
            outs.append([t.cpu() for t in (out, mine["conv_state"], mine["intermediate_conv_window"], parents)])
        return outs

    theirs = forward(original, False, torch.full((2, 17), -7, dtype=torch.long, device=DEVICE))
    each = tree_conv.router(original)
    for a, b in zip(forward(each, True, torch.full((2, 17), -7, dtype=torch.long, device=DEVICE)), theirs):
        assert_identical(a, b, skip=(1,))
    assert (each.engine_calls, each.given_calls) == (3, 0)
    for _ in range(2):  # a second forward: a fresh parent buffer, found again by layer 4
        ours = forward(routed, True, torch.full((2, 17), -7, dtype=torch.long, device=DEVICE))
        for a, b in zip(ours, theirs):
            assert_identical(a, b, skip=(1,))
    assert (routed.engine_calls, routed.given_calls, routed.first_layer) == (6, 4, 4)
    # Taken as given, the parents are read: layer 9 after another forward's parents gets other outputs.
    stale = torch.zeros((2, 17), dtype=torch.long, device=DEVICE)
    args = copies(layers[9])
    run = tree_conv.layer_scope(lambda self, layer, **kw: routed(**kw))
    assert not torch.equal(run(None, SimpleNamespace(layer_id=9), **{**args, "retrieve_parent_token": stale})[0].cpu(),
                           theirs[1][0][0])  # request 0 (1 is the pad slot's)
    # A lower layer than any seen so far finds them itself (and is the first from then on); outside a scope, too.
    args = layers[4]  # call() copies
    assert_identical(call(lambda **kw: run(None, SimpleNamespace(layer_id=2), **kw), args)[:3], theirs[0][:3], skip=(1,))
    assert (routed.given_calls, routed.first_layer) == (5, 2)
    assert "layer 2 below the first seen (4)" in caplog.text  # not in SGLang's forwards: said in the log
    assert_identical(call(routed, args)[:3], theirs[0][:3], skip=(1,))
    assert routed.given_calls == 5 and tree_conv._LAYER.get() is None


def test_install_follows_the_switch_and_wraps_once(sglang_plugin, monkeypatch):
    """install() on a stand-in for gdn_backend (which imports torchvision, absent on this CPU host)."""
    import sys
    import types

    from ddtree_engine.sglang_plugin import tree_conv

    module = types.ModuleType("gdn_backend_stand_in")
    module.causal_conv1d_update = sglang_update()

    class Backend:  # GDNAttnBackend's forward_extend: layer by keyword (SGLang's hybrid backend) or first
        def forward_extend(self, layer, forward_batch, **kwargs):
            return tree_conv._LAYER.get()

    module.GDNAttnBackend = Backend
    unscoped = Backend.forward_extend
    monkeypatch.setitem(sys.modules, "gdn_backend_stand_in", module)
    monkeypatch.setattr(tree_conv, "TARGET", ("gdn_backend_stand_in", "causal_conv1d_update"))
    for off in ("0", "off", " False "):
        monkeypatch.setenv(tree_conv.ENV, off)
        assert tree_conv.install() is False and module.causal_conv1d_update is sglang_update()
    assert tree_conv.counters() is None  # nothing routed: DDTREE_TRACE records null
    monkeypatch.delenv(tree_conv.ENV)  # on by default
    monkeypatch.setattr(tree_conv, "PARENTS_ONCE", False)
    assert tree_conv.install() is True and Backend.forward_extend is unscoped  # PARENTS_ONCE off: no layer scope
    assert module.causal_conv1d_update.parents_once is False
    module.causal_conv1d_update = sglang_update()
    monkeypatch.setattr(tree_conv, "PARENTS_ONCE", True)  # the default
    assert tree_conv.install() is True and tree_conv.install() is True
    assert module.causal_conv1d_update.parents_once is True
    assert module.causal_conv1d_update.original is sglang_update()
    # What DDTREE_TRACE records: the installed router's counts, read when asked.
    assert tree_conv.counters() == {"engine_calls": 0, "given_calls": 0, "first_layer": None, "parents_once": True}
    module.causal_conv1d_update.engine_calls, module.causal_conv1d_update.given_calls = 12, 10
    assert tree_conv.counters()["engine_calls"] == 12 and tree_conv.counters()["given_calls"] == 10
    assert Backend.forward_extend.original is unscoped
    layer = types.SimpleNamespace(layer_id=7)
    assert Backend().forward_extend(layer=layer, forward_batch=None) == 7 and Backend().forward_extend(layer, None) == 7
    assert tree_conv._LAYER.get() is None
    # A build whose gdn_backend binds another conv (NPU, CPU): left as it is.
    def npu_update(*args, **kwargs):
        raise AssertionError("not called")

    module.causal_conv1d_update = npu_update
    assert tree_conv.install() is False and module.causal_conv1d_update is npu_update


def test_the_patched_name_is_what_sglangs_gdn_backend_calls_in_target_verify():
    """gdn_backend itself does not import here (torchvision): read its source for the import and the tree call."""
    import importlib.util

    from ddtree_engine.sglang_plugin import tree_conv

    spec = importlib.util.find_spec(tree_conv.TARGET[0])
    source = open(spec.origin).read()
    assert "from sglang.kernels.ops.mamba.causal_conv1d_triton import (" in source
    assert f"    {tree_conv.TARGET[1]},\n" in source.split("from sglang.kernels.ops.mamba.causal_conv1d_triton import (")[1].split(")")[0]
    verify = source.split("if is_target_verify:\n            batch_size")[1].split("else:")[0]
    assert f"{tree_conv.TARGET[1]}(" in verify and "retrieve_parent_token=retrieve_parent_token" in verify
    # What layer_scope and the parents-once rule rest on: that call sits in GDNAttnBackend.forward_extend, whose
    # first parameter is the layer; every layer of the forward reads the one retrieve_parent_token of the backend's
    # forward metadata; SGLang's hybrid backend passes the layer by name.
    backend = source.split(f"class {tree_conv.BACKEND}(")[1].split("\nclass ")[0]
    extend = backend.split("    def forward_extend(\n")[1].split("\n    def ")[0]
    assert extend.split(")")[0].split(",")[:2] == ["        self", "\n        layer: RadixLinearAttention"]
    assert "if is_target_verify:\n            batch_size" in extend
    assert "retrieve_parent_token = forward_metadata.retrieve_parent_token" in extend
    hybrid = open(importlib.util.find_spec("sglang.srt.layers.attention.hybrid_linear_attn_backend").origin).read()
    assert "return self.linear_attn_backend.forward_extend(" in hybrid
    assert "layer=layer," in hybrid.split("return self.linear_attn_backend.forward_extend(")[1].split(")")[0]


def test_the_gpu_benchmark_script_checks_the_engine_against_sglang(tmp_path):
    """benchmarks/sglang_h200/conv_verify_kernel.py --smoke: its comparison, small and in the interpreter here."""
    import json

    from repo_scripts import load_script

    bench = load_script("benchmarks/sglang_h200/conv_verify_kernel.py", "conv_verify_kernel")
    assert bench.main(str(tmp_path), smoke=DEVICE == "cpu") == 0
    report = json.loads((tmp_path / "conv_verify_kernel.json").read_text())
    assert report["mismatches"] == []
