"""A tree padded to SGLang's CUDA-graph width verifies the same tree, on the CPU (no sglang needed).

The pad rows must change nothing the walk reads. Two toy computations stand in for the target's
two kinds of layers, each reading the inputs the way SGLang's kernels do:
- attention over the prefix and the rows, through the flat custom mask laid out as SGLang's Triton
  backend indexes it (`mask_indptr` steps by C * (prefix + C));
- a recurrence along each row's parent, with parents derived from the first-child / next-sibling
  links as SGLang's conv kernel derives them (`_causal_conv1d_update_kernel`: every row's parent
  starts at 0, then links overwrite it, in row order).
The tree rows' outputs must be the same at width W and padded to C, and must change if a tree row
could see a pad row.
"""

from __future__ import annotations

import random

import pytest
import torch

from ddtree_engine.kernels.tree_step import reference_step
from ddtree_engine.sglang_plugin.padding import pad_tree, tree_custom_mask, verify_rows


def built_tree(seed: int, budget: int, topk: int, depths: int = 5, vocab: int = 11):
    """(tokens, depths, mask, first_child, next_sibling) of one tree built by the reference kernels."""
    logits = torch.randn(depths, vocab, generator=torch.Generator().manual_seed(seed))
    tree, compiled, _ = reference_step(logits, budget, topk, root_token=3, prefix_len=7, target_choice=None)
    tokens, _, depth, _, _, num_nodes = tree
    n = int(num_nodes[0])
    mask, first_child, next_sibling = compiled[0], compiled[3], compiled[4]
    return tokens[:n], depth[:n], mask[:n, :n].bool(), first_child[:n], next_sibling[:n]


def kernel_parents(first_child: torch.Tensor, next_sibling: torch.Tensor) -> list[int]:
    """Parents as SGLang's conv kernel derives them (0 for a row no link reaches)."""
    parent = [0] * first_child.shape[0]
    for row in range(first_child.shape[0]):
        child, sibling = int(first_child[row]), int(next_sibling[row])
        if child != -1:
            parent[child] = row
        if sibling != -1:
            parent[sibling] = parent[row]
    return parent


def toy_forward(tokens, depths, first_child, next_sibling, flat_mask, prefix_lens, rows, seed=0):
    """[bs, rows, 4] float64 outputs: masked attention plus a parent-indexed recurrence."""
    bs = tokens.shape[0]
    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(64, 4, generator=gen, dtype=torch.float64)
    pos_embed = torch.randn(64, 4, generator=gen, dtype=torch.float64)
    outputs, start = [], 0
    for b in range(bs):
        prefix = prefix_lens[b]
        size = rows * (prefix + rows)  # SGLang's seq_mask_len for this request
        mask = flat_mask[start : start + size].view(rows, prefix + rows)
        start += size
        x = embed[tokens[b]] + pos_embed[prefix + depths[b]]  # [rows, 4]
        keys = torch.cat([embed[torch.arange(prefix) % 64], x])  # prefix then the rows
        scores = (x @ keys.T).masked_fill(~mask, float("-inf"))
        attn = torch.softmax(scores, dim=-1) @ keys
        parent = kernel_parents(first_child[b], next_sibling[b])
        state = torch.zeros(rows, 4, dtype=torch.float64)
        for row in range(rows):  # rows are in BFS-like order: a parent precedes its children
            before = torch.zeros(4, dtype=torch.float64) if row == 0 else state[parent[row]]
            state[row] = 0.5 * before + x[row]
        outputs.append(attn + state)
    assert start == flat_mask.numel()  # the layout covers the mask exactly
    return torch.stack(outputs)


def batch_of_trees(seeds, budget, topk):
    trees = [built_tree(s, budget, topk) for s in seeds]
    width = max(t[0].shape[0] for t in trees)
    assert all(t[0].shape[0] == width for t in trees), "the worker's trees all have W rows"
    stack = lambda i: torch.stack([t[i] for t in trees])  # noqa: E731
    return stack(0), stack(1), [t[2] for t in trees], stack(3), stack(4)


@pytest.mark.parametrize(("budget", "topk", "rows"), [(8, 4, 16), (3, 1, 16), (15, 8, 16), (6, 2, 7), (4, 3, 33)])
def test_pad_rows_leave_every_tree_row_unchanged(budget, topk, rows):
    tokens, depths, masks, first_child, next_sibling = batch_of_trees([1, 2, 3], budget, topk)
    width = tokens.shape[1]
    prefix_lens = [5, 9, 1]
    plain = toy_forward(tokens, depths, first_child, next_sibling, tree_custom_mask(masks, prefix_lens, width), prefix_lens, width)
    padded_tree = pad_tree(tokens, depths, first_child, next_sibling, rows)
    padded = toy_forward(*padded_tree, tree_custom_mask(masks, prefix_lens, rows), prefix_lens, rows)
    assert padded.shape[1] == rows
    torch.testing.assert_close(padded[:, :width], plain, rtol=0, atol=1e-12)


def test_a_tree_row_that_could_see_a_pad_row_changes_the_output():
    """The check above can fail: open one tree row's mask onto a pad row and its output moves."""
    tokens, depths, masks, first_child, next_sibling = batch_of_trees([4], 8, 4)
    width, rows, prefix_lens = tokens.shape[1], 16, [6]
    plain = toy_forward(tokens, depths, first_child, next_sibling, tree_custom_mask(masks, prefix_lens, width), prefix_lens, width)
    leaky = tree_custom_mask(masks, prefix_lens, rows).view(rows, prefix_lens[0] + rows).clone()
    leaky[width - 1, prefix_lens[0] + width] = True  # last tree row sees the first pad row
    padded = toy_forward(*pad_tree(tokens, depths, first_child, next_sibling, rows), leaky.reshape(-1), prefix_lens, rows)
    assert not torch.allclose(padded[0, width - 1], plain[0, width - 1])
    torch.testing.assert_close(padded[0, : width - 1], plain[0, : width - 1], rtol=0, atol=1e-12)


def test_padded_arrays_and_mask_layout():
    tokens, depths, masks, first_child, next_sibling = batch_of_trees([5, 6], 8, 4)
    width, rows, prefix_lens = tokens.shape[1], 12, [3, 0]
    p_tokens, p_depths, p_first, p_next = pad_tree(tokens, depths, first_child, next_sibling, rows)
    assert torch.equal(p_tokens[:, :width], tokens) and torch.equal(p_tokens[:, width:], tokens[:, :1].expand(2, rows - width))
    assert torch.equal(p_depths[:, width:], torch.zeros(2, rows - width, dtype=depths.dtype))
    assert (p_first[:, width:] == -1).all() and (p_next[:, width:] == -1).all()
    # No tree row links to a pad row, so the kernel gives every pad row the root as parent.
    assert (p_first[:, :width] < width).all() and (p_next[:, :width] < width).all()
    assert all(kernel_parents(p_first[b], p_next[b])[width:] == [0] * (rows - width) for b in range(2))
    flat = tree_custom_mask(masks, prefix_lens, rows)
    assert flat.dtype == torch.bool and flat.numel() == sum(rows * (p + rows) for p in prefix_lens)
    block = flat[: rows * (3 + rows)].view(rows, 3 + rows)
    assert block[:, :3].all()  # everyone sees the prefix
    assert torch.equal(block[:width, 3 : 3 + width], masks[0])  # the tree's ancestor mask
    assert not block[:width, 3 + width :].any()  # no tree row sees a pad row
    assert torch.equal(block[width:, 3:], torch.eye(rows, dtype=torch.bool)[width:])  # a pad row sees itself
    # Unpadded, it is the layout the worker always built: [W, prefix + W] of ones then the tree.
    plain = tree_custom_mask(masks[:1], [3], width)
    assert torch.equal(plain, torch.cat([torch.ones(width, 3, dtype=torch.bool), masks[0]], dim=1).reshape(-1))


def test_padding_below_the_tree_width_is_refused():
    tokens, depths, masks, first_child, next_sibling = batch_of_trees([7], 8, 4)
    with pytest.raises(ValueError, match="expected rows >= the tree's width 9, got 8"):
        pad_tree(tokens, depths, first_child, next_sibling, 8)
    with pytest.raises(ValueError, match="expected rows >= the tree's width 9, got 8"):
        tree_custom_mask(masks, [2], 8)


@pytest.mark.parametrize(
    ("width", "captured", "bs", "max_bs", "reserve", "rows"),
    [
        (9, 16, 1, 8, 16, 16),  # budget 8, block 16: pad to the graph
        (16, 16, 8, 8, 16, 16),  # already the graph's width
        (9, None, 1, None, 16, 9),  # no graphs (--disable-cuda-graph): eager at W
        (9, 16, 9, 8, 16, 9),  # bigger batch than any graph: eager at W, no pad
        (17, 16, 1, 8, 17, 17),  # a graph narrower than the tree cannot replay it
        (9, 32, 1, 8, 16, 9),  # pad rows would write past the KV reservation
    ],
)
def test_verify_rows(width, captured, bs, max_bs, reserve, rows):
    assert verify_rows(width, captured, bs, max_bs, reserve) == rows


def test_random_trees_and_widths():
    rng = random.Random(0)
    for _ in range(20):
        budget, topk = rng.randint(1, 20), rng.randint(1, 6)
        tokens, depths, masks, first_child, next_sibling = batch_of_trees([rng.randrange(1 << 20) for _ in range(2)], budget, topk)
        width = tokens.shape[1]
        rows = width + rng.randint(0, 10)
        prefix_lens = [rng.randint(0, 12) for _ in range(2)]
        plain = toy_forward(tokens, depths, first_child, next_sibling, tree_custom_mask(masks, prefix_lens, width), prefix_lens, width)
        padded = toy_forward(*pad_tree(tokens, depths, first_child, next_sibling, rows), tree_custom_mask(masks, prefix_lens, rows), prefix_lens, rows)
        torch.testing.assert_close(padded[:, :width], plain, rtol=0, atol=1e-12)
