"""The ancestor-mask reference against the definition (j is i or one of i's ancestors) on every
tree shape: chain, star, full k-ary, random, depth 1."""

from __future__ import annotations

import pytest

from tree_shapes import random_tree
from ddtree_engine.kernels.tree_mask import ancestor_mask


SHAPES = {
    "root alone": [-1],
    "chain": [-1, 0, 1, 2, 3, 4, 5],
    "star (depth 1)": [-1, 0, 0, 0, 0, 0],
    "full binary": [-1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6],
    "full ternary": [-1, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3],
    "random 17": random_tree(17, 0),
    "random 33": random_tree(33, 1),
}


def _ancestors_or_self(parents: list[int], node: int) -> set[int]:
    out = set()
    while node >= 0:
        out.add(node)
        node = parents[node]
    return out


@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_node_sees_itself_and_its_ancestors_only(shape):
    parents = SHAPES[shape]
    mask = ancestor_mask(parents)
    n = len(parents)
    assert mask.shape == (n, n)
    for i in range(n):
        want = _ancestors_or_self(parents, i)
        got = {j for j in range(n) if mask[i, j]}
        assert got == want, f"{shape}: node {i} sees {sorted(got)}, expected {sorted(want)}"


def test_a_parent_after_its_child_is_refused():
    with pytest.raises(ValueError, match="node 1 with parent 2"):
        ancestor_mask([-1, 2, 0])
