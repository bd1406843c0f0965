"""TreePrep (the LM head, the trees and the verify's padded rows of a batch, replayed as one CUDA
graph) gives what the worker built op by op before it: one batched LM head, the trees of TreeStep,
`padding.pad_tree`'s rows and `padding.tree_custom_mask`'s mask. On the CPU (Triton's interpreter)
eagerly; a capture that fails leaves it eager with a warning; on a GPU also through its graph,
replayed on new inputs, every capture in one shared pool."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("triton")  # tests/ddtree_engine/conftest.py set TRITON_INTERPRET without a GPU

from ddtree_engine.kernels.tree_step import TreeStep  # noqa: E402
from ddtree_engine.sglang_plugin import prep as prep_mod  # noqa: E402
from ddtree_engine.sglang_plugin.padding import pad_tree, tree_custom_mask  # noqa: E402
from ddtree_engine.sglang_plugin.prep import (  # noqa: E402
    Graphed,
    GraphPool,
    TreePrep,
    TreePreps,
    graphs_wanted,
    sglang_mask_buffer,
    step_custom_mask,
    verify_mask,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DEPTHS, HIDDEN, VOCAB, PADDED_VOCAB = 5, 8, 40, 48


def weight(seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(PADDED_VOCAB, HIDDEN, generator=g) * 2).to(device)


def hidden_states(bs, seed, device=DEVICE):
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randn(bs, DEPTHS, HIDDEN, generator=g).to(device)


def logits_buffer(bs, w):
    return torch.empty(bs, DEPTHS, w.shape[0], dtype=w.dtype, device=w.device)


def hidden_buffer(bs, w):
    return torch.zeros(bs, DEPTHS, w.shape[1], dtype=w.dtype, device=w.device)


def op_by_op(w, hidden, roots, prefixes, budget, topk, rows):
    """What the worker computed before TreePrep: the batched LM head, TreeStep per request, stacks,
    pad_tree and tree_custom_mask."""
    logits = torch.matmul(hidden, w.T)[..., :VOCAB]
    steps = []
    for i, (root, prefix) in enumerate(zip(roots, prefixes)):
        step = TreeStep(DEPTHS, VOCAB, budget, topk, w.device)
        step.build(logits[i], torch.tensor([root], device=w.device), torch.tensor([prefix], device=w.device))
        steps.append(step)
    tokens, depths = torch.stack([s.tree[0] for s in steps]), torch.stack([s.tree[2] for s in steps])
    first_child, next_sibling = torch.stack([s.compiled[3] for s in steps]), torch.stack([s.compiled[4] for s in steps])
    v = pad_tree(tokens, depths, first_child, next_sibling, rows)
    positions = torch.tensor(prefixes, device=w.device).unsqueeze(1) + v[1]
    mask = tree_custom_mask([s.compiled[0] for s in steps], prefixes, rows)
    return dict(tokens=v[0], depths=v[1], first_child=v[2], next_sibling=v[3], positions=positions), mask, logits


@pytest.mark.parametrize("bs,budget,topk,rows", [(1, 6, 3, 7), (1, 6, 3, 12), (1, 9, 2, 16), (1, 1, 1, 4), (3, 12, 4, 13), (2, 6, 3, 9)])
def test_a_batch_matches_the_op_by_op_path(bs, budget, topk, rows):
    w = weight()
    steps = [TreeStep(DEPTHS, VOCAB, budget, topk, DEVICE) for _ in range(bs)]
    sglang_mask = torch.full((bs * rows * (60 + rows),), 7, dtype=torch.uint8, device=DEVICE)  # SGLang's buffer
    prep = TreePrep(steps, w, VOCAB, rows, logits_buffer(bs + 1, w), hidden_buffer(bs, w), mask_out=sglang_mask)
    for seed in range(3):  # reused across steps: nothing stale survives
        hidden = hidden_states(bs, seed)
        roots = [5 + seed + 3 * i for i in range(bs)]
        prefixes = [(7 + 11 * seed + 5 * i) % 40 for i in range(bs)]
        prep.run(hidden, torch.tensor(roots, device=DEVICE), torch.tensor(prefixes, dtype=torch.int32, device=DEVICE))
        want, mask, logits = op_by_op(w, hidden, roots, prefixes, budget, topk, rows)
        for name, value in want.items():
            assert torch.equal(getattr(prep, name).cpu(), value.cpu()), f"seed {seed}: {name}"
        assert torch.equal(prep.logits[..., :VOCAB].cpu(), logits.cpu())
        assert torch.equal(verify_mask(prep, prefixes).cpu(), mask.cpu()), f"seed {seed}: mask"
        # The same mask written straight into SGLang's buffer, from its start.
        assert torch.equal(sglang_mask[: mask.numel()].cpu(), mask.to(torch.uint8).cpu()), f"seed {seed}: mask in the buffer"


def test_the_worker_cache_grows_its_buffers_and_remakes_what_held_the_old_ones():
    """TreePreps: one prep per (bs, rows); a larger batch gets larger shared buffers and every prep is
    made again (a graph would hold the old buffers); so does a moved LM head; results stay right."""
    w = weight()
    slots = {}
    preps = TreePreps(lambda i: slots.setdefault(i, TreeStep(DEPTHS, VOCAB, 7, 3, DEVICE)), DEPTHS, VOCAB, DEVICE)
    one = preps.get(1, 9, w)
    assert preps.get(1, 9, w) is one and preps.logits.shape == (1, DEPTHS, PADDED_VOCAB)
    assert preps.get(1, 12, w) is not one and preps.get(1, 9, w) is one  # another width: its own prep
    three = preps.get(3, 9, w)
    assert preps.logits.shape[0] == 3 and preps.hidden.shape == (3, DEPTHS, HIDDEN)
    assert preps.get(1, 9, w) is not one  # remade over the new buffers
    assert preps.get(2, 9, w).logits.data_ptr() == preps.logits.data_ptr()  # smaller batches share them
    assert preps.get(3, 9, w) is three and three.steps == [slots[0], slots[1], slots[2]]
    moved = w.clone()
    assert preps.get(3, 9, moved) is not three  # the head's storage moved: remade
    prefixes = [3, 8, 0]
    prep = preps.get(3, 9, moved)
    hidden = hidden_states(3, 5)
    prep.run(hidden, torch.tensor([1, 2, 3], device=DEVICE), torch.tensor(prefixes, device=DEVICE))
    want, mask, _ = op_by_op(moved, hidden, [1, 2, 3], prefixes, 7, 3, 9)
    assert torch.equal(prep.tokens.cpu(), want["tokens"].cpu())
    assert torch.equal(verify_mask(prep, prefixes).cpu(), mask.cpu())
    # A prep writing the verify mask into a buffer: the same buffer keeps it, another remakes it.
    buf = torch.zeros(3 * 9 * (20 + 9), dtype=torch.uint8, device=DEVICE)
    masked = preps.get(3, 9, moved, buf)
    assert masked is not prep and masked.mask_out is buf and preps.get(3, 9, moved, buf) is masked
    other_rows = preps.get(3, 12, moved, buf)
    assert preps.get(3, 9, moved, torch.zeros_like(buf)) is not masked and preps.get(3, 9, moved).mask_out is None
    masked = preps.get(3, 9, moved, buf)
    assert preps.get(3, 12, moved, buf) is not other_rows  # every prep remade, not only the one asked for
    # A batch size the buffer does not fit (None) beside one it fits: neither is remade as they alternate.
    big = preps.get(4, 12, moved, None)  # (grows the shared buffers: every prep remade once)
    small = preps.get(3, 12, moved, buf)
    for _ in range(2):
        assert preps.get(4, 12, moved, None) is big and preps.get(3, 12, moved, buf) is small
    masked.run(hidden, torch.tensor([1, 2, 3], device=DEVICE), torch.tensor(prefixes, device=DEVICE))
    assert torch.equal(buf[: mask.numel()].cpu(), mask.to(torch.uint8).cpu())


def test_the_step_mask_is_a_view_of_sglangs_buffer_when_it_fits():
    """step_custom_mask: the cells the prep wrote, as a view of the buffer's start (SGLang's copy into
    its buffer is then onto itself), equal to the mask built per step; a buffer too small for this
    step's prefixes, or none, gives the built mask."""
    w = weight()
    bs, rows, prefixes = 2, 9, [4, 11]
    need = rows * (sum(prefixes) + bs * rows)
    buf = torch.full((need + 3,), 7, dtype=torch.uint8, device=DEVICE)
    prep = TreePrep([TreeStep(DEPTHS, VOCAB, 7, 3, DEVICE) for _ in range(bs)], w, VOCAB, rows, logits_buffer(bs, w),
                    hidden_buffer(bs, w), mask_out=buf)
    prep.run(hidden_states(bs, 1), torch.tensor([3, 4], device=DEVICE), torch.tensor(prefixes, device=DEVICE))
    built = verify_mask(prep, prefixes)
    mask = step_custom_mask(prep, prefixes)
    assert mask.data_ptr() == buf.data_ptr() and mask.numel() == need == built.numel()
    assert torch.equal(mask, built.to(torch.uint8))
    buf[:need] = mask  # what SGLang's replay does: nothing changes
    assert torch.equal(buf[:need], built.to(torch.uint8)) and bool((buf[need:] == 7).all())
    # Longer prefixes than the buffer holds: the built mask (the prep's writes stopped at its end).
    longer = [40, 11]
    prep.run(hidden_states(bs, 2), torch.tensor([3, 4], device=DEVICE), torch.tensor(longer, device=DEVICE))
    fallback = step_custom_mask(prep, longer)
    assert fallback.data_ptr() != buf.data_ptr() and torch.equal(fallback, verify_mask(prep, longer))
    prep.mask_out = None
    assert torch.equal(step_custom_mask(prep, prefixes), verify_mask(prep, prefixes))


class FakeMode:
    def __init__(self, name):
        self.name = name


class FakeVerifyMask:
    """The fields of SGLang's VerifyMask that sglang_mask_buffer reads (the real one: the plugin's
    contract tests)."""

    def __init__(self, buffer, mode="FULL_MASK", max_bs=2, is_read=True):
        self.buffer, self.mode, self.max_bs, self.is_read = buffer, FakeMode(mode), max_bs, is_read

    def fits(self, bs):
        return bs <= self.max_bs


def test_sglangs_buffer_is_used_only_when_it_holds_the_full_layout_for_the_batch():
    buf = torch.zeros(64, dtype=torch.uint8)
    assert sglang_mask_buffer(FakeVerifyMask(buf), 2) is buf
    assert sglang_mask_buffer(FakeVerifyMask(buf.to(torch.bool)), 1) is not None
    assert sglang_mask_buffer(FakeVerifyMask(buf), 3) is None  # sized for fewer requests
    assert sglang_mask_buffer(FakeVerifyMask(buf, mode="QLEN_ONLY"), 1) is None
    assert sglang_mask_buffer(FakeVerifyMask(buf, is_read=False), 1) is None
    assert sglang_mask_buffer(FakeVerifyMask(buf.to(torch.int32)), 1) is None
    assert sglang_mask_buffer(FakeVerifyMask(buf.view(8, 8)), 1) is None
    assert sglang_mask_buffer(None, 1) is None


def test_fewer_rows_than_the_tree_or_a_short_buffer_are_refused():
    w = weight()
    steps = [TreeStep(DEPTHS, VOCAB, 7, 3, DEVICE)]
    with pytest.raises(ValueError, match="rows >= the trees' width 8"):
        TreePrep(steps, w, VOCAB, 7, logits_buffer(1, w), hidden_buffer(1, w))
    with pytest.raises(ValueError, match=r"logits buffer \[>= 2, 5, 48\]"):
        TreePrep(steps * 2, w, VOCAB, 8, logits_buffer(1, w), hidden_buffer(2, w))
    with pytest.raises(ValueError, match=r"hidden-state buffer \[>= 2, 5, 8\]"):
        TreePrep(steps * 2, w, VOCAB, 8, logits_buffer(2, w), hidden_buffer(1, w))


def test_graphs_only_on_cuda_with_graphs_on(monkeypatch):
    monkeypatch.delenv(prep_mod.GRAPH_ENV, raising=False)
    assert not graphs_wanted(torch.device("cpu"), False)
    assert graphs_wanted(torch.device("cuda", 0), False)
    assert not graphs_wanted(torch.device("cuda", 0), True)
    monkeypatch.setenv(prep_mod.GRAPH_ENV, "0")
    assert not graphs_wanted(torch.device("cuda", 0), False)


def test_the_drafter_graph_at_its_block_is_on_unless_switched_off(monkeypatch):
    monkeypatch.delenv(prep_mod.DRAFT_GRAPH_ENV, raising=False)
    assert prep_mod.draft_graph_at_block()
    for on in ("1", "true", " On ", ""):
        monkeypatch.setenv(prep_mod.DRAFT_GRAPH_ENV, on)
        assert prep_mod.draft_graph_at_block()
    for off in ("0", "false", " Off ", "no"):
        monkeypatch.setenv(prep_mod.DRAFT_GRAPH_ENV, off)
        assert not prep_mod.draft_graph_at_block()


def test_a_failed_capture_runs_op_by_op_from_then_on(monkeypatch, caplog):
    """A capture that raises (here: any) must not stop the server: this step and every later one
    run eagerly, with one warning."""
    calls = []
    graphed = Graphed(lambda: calls.append(1), "cpu", graph=True, pool=None, what="the thing")
    monkeypatch.setattr(graphed, "_capture", lambda: (_ for _ in ()).throw(RuntimeError("operation not permitted when stream is capturing")))
    with caplog.at_level(logging.WARNING, logger=prep_mod.__name__):
        graphed()
        graphed()
    assert calls == [1, 1] and not graphed.graph_wanted and graphed.graph is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "capturing the thing in a CUDA graph failed" in warnings[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("budget,topk,rows", [(15, 8, 16), (8, 4, 16), (31, 8, 32)])
def test_the_graphs_replay_what_the_ops_give_on_new_inputs(budget, topk, rows):
    """Real sizes (L 15, V 151,936, bf16), batch sizes 1 and 3 captured into one pool and replayed
    in turns: each equals an eager prep, step after step."""
    depths, hidden_size, vocab = 15, 256, 151_936
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(vocab + 64, hidden_size, generator=g) * 0.05).to("cuda", torch.bfloat16)
    pool = GraphPool()
    slots = [TreeStep(depths, vocab, budget, topk, "cuda") for _ in range(3)]
    buf = torch.empty(3, depths, vocab + 64, dtype=torch.bfloat16, device="cuda")
    hid = torch.zeros(3, depths, hidden_size, dtype=torch.bfloat16, device="cuda")
    mask = torch.zeros(3 * rows * (3000 + rows), dtype=torch.uint8, device="cuda")  # SGLang's buffer
    graphed = {bs: TreePrep(slots[:bs], w, vocab, rows, buf, hid, graph=True, pool=pool, mask_out=mask) for bs in (1, 3)}
    eager_buf, eager_hid = torch.empty_like(buf), torch.zeros_like(hid)
    eager = {bs: TreePrep([TreeStep(depths, vocab, budget, topk, "cuda") for _ in range(bs)], w, vocab, rows, eager_buf, eager_hid)
             for bs in (1, 3)}
    for seed in range(6):
        bs = 1 if seed % 2 == 0 else 3
        gen = torch.Generator().manual_seed(seed)
        hidden = (torch.randn(bs, depths, hidden_size, generator=gen) * 4).to("cuda", torch.bfloat16)
        roots = torch.arange(bs, device="cuda") + 100 + seed
        prefixes = torch.arange(bs, device="cuda") * 7 + 500 * seed
        graphed[bs].run(hidden, roots, prefixes)
        eager[bs].run(hidden, roots, prefixes)
        torch.cuda.synchronize()
        for name in ("tokens", "depths", "first_child", "next_sibling", "positions", "block", "logits"):
            assert torch.equal(getattr(graphed[bs], name), getattr(eager[bs], name)), f"step {seed} bs {bs}: {name}"
        want = verify_mask(eager[bs], prefixes.tolist())  # the graph wrote the step's mask into SGLang's buffer
        assert torch.equal(mask[: want.numel()], want.to(torch.uint8)), f"step {seed} bs {bs}: mask"
    assert all(p._run.graph is not None for p in graphed.values())


@pytest.mark.parametrize(("budget", "topk"), [(15, 4), (9, 3)])
def test_the_warm_up_runs_the_whole_step_on_the_servers_shape(budget, topk):
    """The worker's start runs its slot-0 step once (so Triton compiles there): LM head in the head's dtype, a
    full tree of zero logits (every depth ties: ids 0 .. K-1), its compile and its walk, in the step's buffers."""
    w = weight().to(torch.bfloat16) if DEVICE == "cuda" else weight()
    step = TreeStep(DEPTHS, VOCAB, budget, topk, w.device)
    prep_mod.warm_up(step, w, VOCAB)
    reference = TreeStep(DEPTHS, VOCAB, budget, topk, w.device)
    zeros = torch.zeros(DEPTHS, VOCAB, dtype=w.dtype, device=w.device)
    root = torch.zeros(1, dtype=torch.int64, device=w.device)
    reference.build(zeros, root, root)
    reference.walk(torch.zeros(reference.num_rows, dtype=torch.int64, device=w.device))
    assert int(step.tree[5][0]) == budget + 1  # the root and `budget` drafted nodes
    for got, want in zip((*step.tree, *step.compiled, *step.walked), (*reference.tree, *reference.compiled, *reference.walked)):
        assert torch.equal(got, want)
    assert set(step.tree[0][1:].tolist()) <= set(range(topk))
