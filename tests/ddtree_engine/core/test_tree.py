"""build_tree / compile_tree / spine_of / walk on explicit cases and against brute force."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from ddtree_engine.core.tree import build_tree, chain_tree, compile_tree, spine_of
from ddtree_engine.core.walk import walk
from ddtree_engine.errors import BadInputError


def _prefix_scores(logits: torch.Tensor, k: int) -> dict[tuple[int, ...], float]:
    """Every prefix of ranks (r1, ..., rd) over the top-k per depth, with its log-probability."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    vals = torch.sort(logp, dim=-1, descending=True, stable=True).values[:, :k]
    out = {}
    for d in range(1, logits.shape[0] + 1):
        for ranks in itertools.product(range(k), repeat=d):
            out[ranks] = sum(vals[i, r].item() for i, r in enumerate(ranks))
    return out


def _rank_paths(tree) -> list[tuple[int, ...]]:
    parents, ranks = tree.parents.tolist(), tree.ranks.tolist()
    paths = []
    for i in range(1, tree.num_nodes):
        path, node = [], i
        while node > 0:
            path.append(ranks[node])
            node = parents[node]
        paths.append(tuple(reversed(path)))
    return paths


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("budget,topk", [(1, 1), (4, 2), (7, 3), (10, 8), (15, 4)])
def test_build_tree_picks_the_most_probable_prefixes(seed, budget, topk):
    torch.manual_seed(seed)
    depth, vocab = 4, 11
    logits = torch.randn(depth, vocab) * 2
    tree = build_tree(logits, budget, topk, root_token=5)
    k = min(topk, budget, vocab)
    scores = _prefix_scores(logits, k)
    chosen = _rank_paths(tree)
    assert len(chosen) == min(budget, len(scores))
    assert len(set(chosen)) == len(chosen)
    # Prefix-closed, and no unchosen prefix whose parent is chosen beats the worst chosen one.
    for path in chosen:
        assert len(path) == 1 or path[:-1] in chosen
    worst = min(scores[p] for p in chosen)
    frontier = [p for p in scores if p not in chosen and (len(p) == 1 or p[:-1] in chosen)]
    assert all(scores[p] <= worst + 1e-12 for p in frontier)
    # The optimal set is the top-`budget` prefixes (products of probabilities only shrink with depth).
    best = sorted(scores.values(), reverse=True)[: len(chosen)]
    assert math.isclose(sum(best), sum(scores[p] for p in chosen), rel_tol=1e-9)


def test_tree_is_depth_major_with_contiguous_sibling_runs():
    torch.manual_seed(1)
    tree = build_tree(torch.randn(6, 20), 30, 4, root_token=0)
    parents, depths = tree.parents.tolist(), tree.depths.tolist()
    assert parents[0] == -1 and depths[0] == 0
    assert depths == sorted(depths)
    for i in range(1, tree.num_nodes):
        assert parents[i] < i and depths[i] == depths[parents[i]] + 1
    assert parents[1:] == sorted(parents[1:])  # children grouped by parent, in parent order


def test_budget_zero_is_the_root_alone_and_bad_arguments_are_refused():
    tree = build_tree(torch.randn(5, 9), 0, 3, root_token=7)
    assert tree.tokens.tolist() == [7] and tree.parents.tolist() == [-1]
    with pytest.raises(BadInputError, match="budget"):
        build_tree(torch.randn(5, 9), -1, 3, root_token=7)
    with pytest.raises(BadInputError, match="topk"):
        build_tree(torch.randn(5, 9), 4, 0, root_token=7)


def test_ties_break_deterministically_towards_lower_token_ids():
    logits = torch.zeros(3, 6)  # every token equally likely
    a = build_tree(logits, 5, 3, root_token=0)
    b = build_tree(logits.clone(), 5, 3, root_token=0)
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.tokens.tolist()[1:4] == [0, 1, 2]


def test_topk_one_and_large_budget_is_the_argmax_chain():
    torch.manual_seed(3)
    logits = torch.randn(15, 50)
    tree = build_tree(logits, 64, 1, root_token=9)
    assert tree.tokens.tolist() == [9] + logits.argmax(-1).tolist()
    assert tree.tokens.tolist() == chain_tree(logits.argmax(-1), 9).tokens.tolist()


def test_spine_depth_reserves_the_top1_chain():
    # Depth 1 is uncertain (a strong sibling), deeper depths are near-certain: without the
    # spine the budget goes to the sibling's subtree first.
    logits = torch.full((4, 10), -10.0)
    logits[:, 0] = 0.0
    logits[0, 1] = 0.0
    logits[1:, 0] = -3.0
    tree = build_tree(logits, 3, 2, root_token=99, spine_depth=3)
    assert spine_of(tree).num_nodes == 4  # root + a full spine of depth 3
    assert _rank_paths(tree) == [(0,), (0, 0), (0, 0, 0)]
    plain = build_tree(logits, 3, 2, root_token=99)
    assert (1,) in _rank_paths(plain)


def test_compile_tree_mask_is_ancestor_only_and_links_children():
    torch.manual_seed(4)
    tree = build_tree(torch.randn(5, 12), 12, 3, root_token=1)
    c = compile_tree(tree, prefix_len=100)
    parents = tree.parents.tolist()
    for i in range(tree.num_nodes):
        ancestors, node = {i}, i
        while parents[node] >= 0:
            node = parents[node]
            ancestors.add(node)
        assert set(torch.nonzero(c.attention_mask[i]).flatten().tolist()) == ancestors
    assert c.positions.tolist() == [100 + d for d in tree.depths.tolist()]
    for p in range(tree.num_nodes):
        kids, child = [], c.first_child[p].item()
        while child >= 0:
            kids.append(child)
            child = c.next_sibling[child].item()
        assert kids == [i for i in range(tree.num_nodes) if parents[i] == p]


def test_walk_follows_target_choices_and_returns_the_bonus():
    # root -> {a=10, b=11}; a -> {c=12}; b -> {d=13, e=14}
    from ddtree_engine.core.tree import DraftTree

    tree = DraftTree(
        tokens=torch.tensor([1, 10, 11, 12, 13, 14]),
        parents=torch.tensor([-1, 0, 0, 1, 2, 2]),
        depths=torch.tensor([0, 1, 1, 2, 2, 2]),
        ranks=torch.tensor([-1, 0, 1, 0, 0, 1]),
        scores=torch.zeros(6, dtype=torch.float64),
    )
    c = compile_tree(tree, 0)
    # The target picks b at the root, then e under b, then 77 after e.
    choice = torch.tensor([11, 12, 14, 0, 0, 77])
    result = walk(c, choice)
    assert result.path == [0, 2, 5]
    assert result.accepted_tokens == [11, 14]
    assert result.bonus_token == 77 and result.commit_len == 3
    nothing = walk(c, torch.tensor([50, 0, 0, 0, 0, 0]))
    assert nothing.path == [0] and nothing.bonus_token == 50 and nothing.accepted_drafts == 0
