"""TreePrep (the LM head, the tree and the verify's padded rows of one request, replayed as one CUDA
graph) gives what the worker built op by op before it: the tree of TreeStep on hidden @ W.T,
`padding.pad_tree`'s rows and `padding.tree_custom_mask`'s mask. On the CPU (Triton's interpreter)
eagerly; on a GPU also through its graph, replayed on new inputs."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")  # tests/ddtree_engine/conftest.py set TRITON_INTERPRET without a GPU

from ddtree_engine.kernels.tree_step import TreeStep  # noqa: E402
from ddtree_engine.sglang_plugin import prep as prep_mod  # noqa: E402
from ddtree_engine.sglang_plugin.padding import pad_tree, tree_custom_mask  # noqa: E402
from ddtree_engine.sglang_plugin.prep import TreePrep, graphs_wanted, stacked, verify_mask  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DEPTHS, HIDDEN, VOCAB, PADDED_VOCAB = 5, 8, 40, 48


def weight(seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(PADDED_VOCAB, HIDDEN, generator=g) * 2).to(device)


def hidden_states(seed, device=DEVICE):
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randn(DEPTHS, HIDDEN, generator=g).to(device)


def op_by_op(w, hidden, root, prefix, budget, topk, rows):
    """What the worker computed before TreePrep: logits, TreeStep, stack, pad_tree, tree_custom_mask."""
    logits = torch.matmul(hidden, w.T)[:, :VOCAB]
    step = TreeStep(DEPTHS, VOCAB, budget, topk, w.device)
    step.build(logits, torch.tensor([root], device=w.device), torch.tensor([prefix], device=w.device))
    tokens, _, depths, _, _, _ = step.tree
    mask, _, _, first_child, next_sibling = step.compiled
    v = pad_tree(tokens[None], depths[None], first_child[None], next_sibling[None], rows)
    positions = prefix + v[1]
    return (*v, positions), mask, logits


@pytest.mark.parametrize("budget,topk,rows", [(6, 3, 7), (6, 3, 12), (9, 2, 16), (1, 1, 4), (12, 4, 13)])
def test_one_request_matches_the_op_by_op_path(budget, topk, rows):
    w = weight()
    step = TreeStep(DEPTHS, VOCAB, budget, topk, DEVICE)
    prep = TreePrep(step, w, VOCAB, rows)
    for seed, prefix in ((1, 7), (2, 30), (3, 0)):  # reused across steps: nothing stale survives
        hidden, root = hidden_states(seed), 5 + seed
        prep.run(hidden, torch.tensor([root], device=DEVICE), torch.tensor([prefix], dtype=torch.int32, device=DEVICE))
        (tokens, depths, first_child, next_sibling, positions), mask, logits = op_by_op(w, hidden, root, prefix, budget, topk, rows)
        for name, want in (("tokens", tokens), ("depths", depths), ("first_child", first_child),
                           ("next_sibling", next_sibling), ("positions", positions)):
            assert torch.equal(stacked([prep], name).cpu(), want.cpu()), f"seed {seed}: {name}"
        assert torch.equal(prep.logits.cpu(), logits.cpu())
        got = verify_mask([prep], [prefix])
        assert torch.equal(got.cpu(), tree_custom_mask([mask], [prefix], rows).cpu()), f"seed {seed}: mask"


def test_a_batch_lays_out_each_request_after_the_other():
    w = weight()
    rows, prefixes = 10, [4, 9, 1]
    preps, masks, want = [], [], []
    for i, prefix in enumerate(prefixes):
        prep = TreePrep(TreeStep(DEPTHS, VOCAB, 7, 3, DEVICE), w, VOCAB, rows)
        prep.run(hidden_states(i), torch.tensor([2 + i], device=DEVICE), torch.tensor([prefix], device=DEVICE))
        preps.append(prep)
        arrays, mask, _ = op_by_op(w, hidden_states(i), 2 + i, prefix, 7, 3, rows)
        masks.append(mask)
        want.append(arrays)
    assert torch.equal(verify_mask(preps, prefixes).cpu(), tree_custom_mask(masks, prefixes, rows).cpu())
    got = stacked(preps, "tokens")
    assert got.shape == (3, rows)
    assert torch.equal(got.cpu(), torch.cat([a[0] for a in want]).cpu())


def test_fewer_rows_than_the_tree_are_refused():
    with pytest.raises(ValueError, match="rows >= the tree's width 8"):
        TreePrep(TreeStep(DEPTHS, VOCAB, 7, 3, DEVICE), weight(), VOCAB, 7)


def test_graphs_only_on_cuda_with_graphs_on(monkeypatch):
    monkeypatch.delenv(prep_mod.GRAPH_ENV, raising=False)
    assert not graphs_wanted(torch.device("cpu"), False)
    assert graphs_wanted(torch.device("cuda", 0), False)
    assert not graphs_wanted(torch.device("cuda", 0), True)
    monkeypatch.setenv(prep_mod.GRAPH_ENV, "0")
    assert not graphs_wanted(torch.device("cuda", 0), False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("budget,topk,rows", [(15, 8, 16), (8, 4, 16), (31, 8, 32)])
def test_the_graph_replays_what_the_ops_give_on_new_inputs(budget, topk, rows):
    """Real sizes (L 15, V 151,936, bf16): the captured prep equals an eager one, step after step."""
    depths, hidden_size, vocab = 15, 256, 151_936
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(vocab + 64, hidden_size, generator=g) * 0.05).to("cuda", torch.bfloat16)
    graphed = TreePrep(TreeStep(depths, vocab, budget, topk, "cuda"), w, vocab, rows, graph=True)
    eager = TreePrep(TreeStep(depths, vocab, budget, topk, "cuda"), w, vocab, rows, graph=False)
    for seed in range(4):
        hidden = (torch.randn(depths, hidden_size, generator=torch.Generator().manual_seed(seed)) * 4).to("cuda", torch.bfloat16)
        root, prefix = torch.tensor([100 + seed], device="cuda"), torch.tensor([500 * seed], device="cuda")
        graphed.run(hidden, root, prefix)
        eager.run(hidden, root, prefix)
        torch.cuda.synchronize()
        for name in ("tokens", "depths", "first_child", "next_sibling", "positions", "block", "logits"):
            assert torch.equal(getattr(graphed, name), getattr(eager, name)), f"step {seed}: {name}"
    assert graphed._graph is not None
