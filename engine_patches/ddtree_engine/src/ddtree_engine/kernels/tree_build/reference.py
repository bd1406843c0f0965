"""Reference: best-first selection of the `budget` most probable prefixes from per-depth top-K.

The selection core.tree.build_tree runs after its top-K step (`select_prefixes`, over the [L, K]
candidate table), laid out as the kernel's fixed-shape arrays (`build_tree_arrays`) so the kernel
can be compared with it directly; tests hold those arrays equal to core.tree.build_tree's DraftTree.

Without spine reservation the selection order is a fixed order of the full K-ary tree, so a
parallel selection may take its first `budget` nodes instead of popping `budget` times: every depth
shares one row of log-probs, so a node is proposed when its proposer (elder sibling, or parent for
rank 0) is chosen, and the heap's key (score, depth, rank, proposal counter) orders like
(-score, depth, rank, key(proposer)) (tests/ddtree_engine/kernels/test_tree_build.py holds this).
"""

from __future__ import annotations

import heapq

import torch


def select_prefixes(vals: list[list[float]], budget: int, spine_depth: int) -> list[tuple[int, int, int, float]]:
    """The chosen prefixes in selection order (core.tree.build_tree's selection on the host).

    Args:
        vals: [L][K] per-depth log-probs, each row sorted best first.
        budget: prefixes to choose.
        spine_depth: first reserve the top-1 chain down to this depth.

    Returns:
        (depth0, rank, parent's selection index or -1, score) per chosen prefix.
    """
    depth_count = len(vals)
    k = len(vals[0]) if depth_count else 0
    chosen: list[tuple[int, int, int, float]] = []
    if depth_count == 0 or k == 0 or budget == 0:
        return chosen
    heap: list[tuple[float, int, int, int, int]] = []
    counter = 0

    def propose(score: float, depth0: int, rank: int, parent: int) -> None:
        nonlocal counter
        if depth0 < depth_count and rank < k:
            heapq.heappush(heap, (-score, depth0, rank, counter, parent))
            counter += 1

    def accept(score: float, depth0: int, rank: int, parent: int) -> None:
        chosen.append((depth0, rank, parent, score))
        me = len(chosen) - 1
        parent_score = chosen[parent][3] if parent >= 0 else 0.0
        if rank + 1 < k:
            propose(parent_score + vals[depth0][rank + 1], depth0, rank + 1, parent)
        if depth0 + 1 < depth_count:
            propose(score + vals[depth0 + 1][0], depth0 + 1, 0, me)

    spine = min(spine_depth, depth_count, budget)
    score = 0.0
    for d in range(spine):
        score += vals[d][0]
        heap = [h for h in heap if not (h[1] == d and h[2] == 0)]
        heapq.heapify(heap)
        accept(score, d, 0, len(chosen) - 1 if d > 0 else -1)
    if spine == 0:
        propose(vals[0][0], 0, 0, -1)
    while heap and len(chosen) < budget:
        neg, d, r, _, parent = heapq.heappop(heap)
        accept(-neg, d, r, parent)
    return chosen


def select_by_levels(vals: list[list[float]], budget: int) -> list[tuple[int, ...]]:
    """The same choice as `select_prefixes` (no spine), as rank paths in selection order, by levels.

    The blueprint of a parallel build: the chosen set is the `budget` smallest proposer keys of
    the full tree (tests/ddtree_engine/kernels/test_tree_build.py: `proposer_key`), and closed under
    proposers, so a chosen node at depth d is among the `budget`
    best children of the level kept at depth d - 1 (were it not, `budget` better nodes would be
    chosen besides it). Each level is one top-`budget` over at most budget * K candidates, the
    last step one top-`budget` over the L kept levels: L + 1 selections instead of `budget` pops.

    The keys are flat, no proposer chains: within a level, (-score, rank, the parent's place in
    its level), since two same-rank children with equal scores order as their parents do (their
    elder siblings' scores are monotone in the parents' scores); across levels, (-score, depth,
    place in its level).
    """
    kept: list[list[tuple[float, tuple[int, ...]]]] = []  # per level, (score, path) best first
    level: list[tuple[float, tuple[int, ...]]] = [(0.0, ())]
    for row in vals:
        children = [
            (-(score + row[r]), r, place, score + row[r], path + (r,))
            for place, (score, path) in enumerate(level)
            for r in range(len(row))
        ]
        level = [(c[3], c[4]) for c in sorted(children)[:budget]]
        kept.append(level)
    merged = sorted((-score, depth, place, path) for depth, lv in enumerate(kept) for place, (score, path) in enumerate(lv))
    return [m[3] for m in merged[:budget]]


def build_tree_arrays(
    vals: torch.Tensor, ids: torch.Tensor, budget: int, root_token: int, spine_depth: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The draft tree over the per-depth top-K, in the kernel's fixed shape N = budget + 1.

    Args:
        vals: [L, K] float64 log-probs per depth, best first (kernels.topk_logprobs).
        ids: [L, K] their token ids.
        budget: drafted nodes (the root is extra).
        root_token: the token at node 0.
        spine_depth: reserve the top-1 chain down to this depth first.

    Returns:
        (tokens, parents, depths, ranks [N] int64, scores [N] float64, num_nodes [1] int64),
        depth-major, siblings contiguous in rank order. Rows from num_nodes on are padding:
        token = root_token, parent -1, depth 0, rank -1, score -inf.
    """
    chosen = select_prefixes(vals.double().tolist(), budget, spine_depth)
    top_ids = ids.tolist()
    n_out = budget + 1
    tokens = [root_token] * n_out
    parents, depths, ranks, scores = [-1] * n_out, [0] * n_out, [-1] * n_out, [float("-inf")] * n_out
    scores[0] = 0.0
    new_index = {-1: 0}
    by_depth: dict[int, list[int]] = {}
    for i, node in enumerate(chosen):
        by_depth.setdefault(node[0], []).append(i)
    at = 1
    for d in sorted(by_depth):
        for i in sorted(by_depth[d], key=lambda i: (new_index[chosen[i][2]], chosen[i][1])):
            depth0, rank, parent, score = chosen[i]
            new_index[i] = at
            tokens[at], parents[at], depths[at], ranks[at], scores[at] = (
                top_ids[depth0][rank],
                new_index[parent],
                depth0 + 1,
                rank,
                score,
            )
            at += 1
    long = dict(dtype=torch.long)
    return (
        torch.tensor(tokens, **long),
        torch.tensor(parents, **long),
        torch.tensor(depths, **long),
        torch.tensor(ranks, **long),
        torch.tensor(scores, dtype=torch.float64),
        torch.tensor([at], **long),
    )
