"""The SGLang worker's commit arithmetic, on the CPU (no sglang needed).

`window_order` decides which KV slot ends up at which position after a verify; a wrong order
keeps the output lossless only by luck (the next step would read another node's KV), so it is
checked against a plain reference on trees walked the way the worker walks them. (The inline
formula the first H200 runs used scattered with duplicate indices, so the root's key was
whichever write landed last: on the CPU the root sorted after the path. This test caught it.)
"""

from __future__ import annotations

import random

import pytest
import torch

from ddtree_engine.kernels.tree_step import reference_step
from ddtree_engine.sglang_plugin.commit import flattened_links, last_accepted_row, parents_from_links, window_order
from ddtree_engine.sglang_plugin.tree_shape import max_tree_nodes, verify_width


def reference_order(path: list[int], commit_len: int, width: int) -> list[int]:
    head = path[:commit_len]
    return head + [j for j in range(width) if j not in head]


def walked_batch(seed: int, budget: int, topk: int, bs: int = 4, depths: int = 6, vocab: int = 12):
    """Trees built and walked as the worker does (reference kernels), with target choices that
    follow the tree for a random number of levels."""
    rng = random.Random(seed)
    paths, lens = [], []
    for _ in range(bs):
        logits = torch.randn(depths, vocab, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
        tree, _, _ = reference_step(logits, budget, topk, root_token=3, prefix_len=7, target_choice=None)
        tokens, parents, _, _, _, num_nodes = tree
        n = int(num_nodes[0])
        children = {i: [j for j in range(n) if int(parents[j]) == i] for i in range(n)}
        choice = torch.full((tokens.shape[0],), vocab + 1, dtype=torch.int64)  # never a drafted token
        node = 0
        while children[node] and rng.random() < 0.8:
            nxt = rng.choice(children[node])
            choice[node] = tokens[nxt]
            node = nxt
        _, _, walked = reference_step(logits, budget, topk, 3, 7, choice)
        paths.append(walked[0])
        lens.append(int(walked[2][0]))
    return torch.stack(paths), torch.tensor(lens)


@pytest.mark.parametrize("budget,topk", [(1, 1), (5, 1), (8, 2), (15, 4), (20, 3)])
@pytest.mark.parametrize("seed", range(6))
def test_window_order_puts_the_accepted_path_first(budget, topk, seed):
    path, lens = walked_batch(seed, budget, topk)
    order = window_order(path, lens)
    width = path.shape[1]
    for row in range(path.shape[0]):
        assert order[row].tolist() == reference_order(path[row].tolist(), int(lens[row]), width)
        assert sorted(order[row].tolist()) == list(range(width))  # a permutation: no slot lost
    # What the worker does with it: slot ids of the window, reordered, then read back by position.
    slots = torch.arange(100, 100 + width).expand(path.shape[0], width)
    committed = torch.gather(slots, 1, order)
    for row in range(path.shape[0]):
        for t in range(int(lens[row])):
            assert committed[row, t] == slots[row, path[row, t]]


def test_some_walk_goes_deeper_than_one_level():
    """The cases above are not all trivial (a root-only commit would pass any order)."""
    deep = 0
    for seed in range(6):
        _, lens = walked_batch(seed, 15, 4)
        deep += int((lens > 2).sum())
    assert deep >= 3


def test_last_accepted_row_is_the_path_end_not_the_chain_index():
    path = torch.tensor([[0, 3, 7, -1], [0, -1, -1, -1], [0, 1, 2, 3]])
    lens = torch.tensor([3, 1, 4])
    assert last_accepted_row(path, lens).tolist() == [7, 0, 3]


@pytest.mark.parametrize("depths,topk", [(1, 1), (3, 1), (2, 2), (3, 2), (2, 3), (4, 2)])
def test_max_tree_nodes_is_what_the_build_reaches(depths, topk):
    logits = torch.randn(depths, 9, generator=torch.Generator().manual_seed(depths * 10 + topk))
    tree, _, _ = reference_step(logits, 10_000, topk, 0, 0, None)
    assert int(tree[5][0]) - 1 == max_tree_nodes(depths, topk)


def test_verify_width():
    assert verify_width(15, 8, 16) == 16  # DFLASH's width at budget = block - 1
    assert verify_width(32, 1, 16) == 16  # a chain cannot be longer than the block
    assert verify_width(32, 4, 16) == 33
    assert verify_width(1, 1, 16) == 2
    with pytest.raises(ValueError):
        max_tree_nodes(-1, 2)


@pytest.mark.parametrize("budget,topk", [(1, 1), (8, 1), (15, 8), (20, 3), (32, 4)])
def test_safe_links_give_every_node_its_tree_parent(budget, topk):
    # What the worker hands SGLang's GDN kernels in safe mode (the compiled first-child / next-sibling
    # arrays) read back as parents: exactly the tree's, so each node's state comes from its parent.
    logits = torch.randn(15, 40, generator=torch.Generator().manual_seed(budget * 7 + topk))
    tree, compiled, _ = reference_step(logits, budget, topk, 3, 11, None)
    n = int(tree[5][0])
    links = parents_from_links(compiled[3][None, :n], compiled[4][None, :n])
    assert links[0].tolist() == [-1] + tree[1][1:n].tolist()
    if topk > 1 and budget > 2:
        assert any(int(p) != j - 1 for j, p in enumerate(tree[1][1:n].tolist(), start=1)), "not a chain: siblings exist"


def test_unsafe_links_chain_the_flattened_rows():
    first_child, next_sibling = flattened_links(2, 5)
    assert first_child.tolist() == [[1, 2, 3, 4, -1]] * 2
    assert next_sibling.tolist() == [[-1] * 5] * 2
    assert parents_from_links(first_child, next_sibling).tolist() == [[-1, 0, 1, 2, 3]] * 2
