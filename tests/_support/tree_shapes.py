"""Parent arrays of the tree shapes the kernel tests share (-1 = the root; parents precede children)."""

from __future__ import annotations

import random


def random_tree(n: int, seed: int) -> list[int]:
    """Each node's parent drawn uniformly from the nodes before it (not depth-major in general)."""
    rng = random.Random(seed)
    return [-1] + [rng.randrange(i) for i in range(1, n)]


def random_depth_major_tree(n: int, seed: int) -> list[int]:
    """A random depth-major tree: parents non-decreasing (siblings contiguous), parent < child."""
    rng = random.Random(seed)
    parents = [-1]
    for i in range(1, n):
        parents.append(rng.randrange(max(parents[-1], 0), i))
    return parents


def depth_major(parents: list[int]) -> list[int]:
    """The same tree relabelled breadth-first, children in their index order (the engine's node order)."""
    depth: list[int] = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    order = sorted(range(len(parents)), key=lambda i: (depth[i], i))
    new = {old: j for j, old in enumerate(order)}
    return [-1 if parents[old] < 0 else new[parents[old]] for old in order]


def kary(k: int, n: int) -> list[int]:
    """The first n nodes of the full k-ary tree, breadth-first."""
    return [-1] + [(i - 1) // k for i in range(1, n)]
