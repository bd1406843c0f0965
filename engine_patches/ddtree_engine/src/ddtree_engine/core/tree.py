"""Draft tree construction and compilation (pure PyTorch reference).

A tree has N = 1 + budget nodes in depth-major order; node 0 is the root (the last committed,
not yet verified token). A drafted node at depth d (1-based) holds a token proposed for the
d-th position after the root.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import BadInputError
from ..kernels import tree_build, tree_mask
from ..kernels.dispatch import use_kernel
from ..kernels.topk_logprobs import sorted_topk_logprobs
from ..kernels.tree_mask import ancestor_mask
from ..types import validate_tree_args


@dataclass(frozen=True)
class DraftTree:
    """Node arrays, all shape [N], depth-major, node 0 the root.

    tokens: token ids; parents: parent index (-1 for the root); depths: 0 for the root;
    ranks: the token's rank among the top-K of its depth (0 = the drafter's argmax; -1 root);
    scores: sum of per-depth log-probabilities along the path (0 for the root).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    ranks: torch.Tensor
    scores: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def max_depth(self) -> int:
        return int(self.depths.max().item())


@dataclass(frozen=True)
class CompiledTree:
    """What a verify forward needs. Shapes: mask [N, N] (True = may attend), the rest [N]."""

    tree: DraftTree
    attention_mask: torch.Tensor
    positions: torch.Tensor
    parents: torch.Tensor
    first_child: torch.Tensor
    next_sibling: torch.Tensor


def build_tree(
    draft_logits: torch.Tensor,
    budget: int,
    topk: int,
    root_token: int,
    spine_depth: int = 0,
) -> DraftTree:
    """Pick the `budget` most probable prefixes from per-depth draft distributions.

    Args:
        draft_logits: [L, V] drafter logits for the L positions after the root.
        budget: drafted nodes to keep (the root is extra); 0 gives the root alone.
        topk: candidates per depth, K = min(topk, budget, V).
        root_token: the token at node 0.
        spine_depth: first reserve the top-1 chain down to this depth (capped by L and budget).

    Returns:
        A DraftTree, depth-major, siblings contiguous in rank order. A node's score is the sum
        of its path's per-depth log-probabilities; selection is best-first: each chosen node
        proposes its next sibling and its first child, the best open proposal is taken next.
        Ties break towards the shallower depth, then the lower rank, then the earlier proposal.
        On CUDA logits (or with DDTREE_KERNELS=triton) the kernels of kernels/topk_logprobs and
        kernels/tree_build build the same tree on the device; it is returned on the CPU.
    """
    validate_tree_args(budget, topk)
    if draft_logits.dim() != 2:
        raise BadInputError(f"draft_logits must be [L, V], got shape {tuple(draft_logits.shape)}")
    depth_count, vocab = draft_logits.shape
    k = min(topk, budget, vocab)
    if depth_count > 0 and k > 0 and use_kernel(draft_logits) and tree_build.kernel_supports(depth_count, k, budget):
        return _from_arrays(tree_build.build_tree_arrays(draft_logits, budget, topk, root_token, spine_depth))
    chosen: list[tuple[int, int, int, float]] = []  # (depth0, rank, parent_choice_index, score)
    top_ids: list[list[int]] = []
    if depth_count > 0 and k > 0:
        top_vals, top_idx = sorted_topk_logprobs(draft_logits, k)
        top_ids = top_idx.tolist()
        chosen = tree_build.reference.select_prefixes(top_vals.tolist(), budget, spine_depth)
    return _assemble(chosen, top_ids, root_token)


def _from_arrays(arrays: tuple[torch.Tensor, ...]) -> DraftTree:
    """A DraftTree on the CPU from tree_build's fixed-shape arrays (cut at num_nodes)."""
    tokens, parents, depths, ranks, scores, num_nodes = (a.cpu() for a in arrays)
    n = int(num_nodes[0])
    return DraftTree(tokens=tokens[:n], parents=parents[:n], depths=depths[:n], ranks=ranks[:n], scores=scores[:n])


def _assemble(chosen: list, top_ids: list[list[int]], root_token: int) -> DraftTree:
    """Order chosen nodes depth-major (siblings by rank under their parent's new index)."""
    new_index = {-1: 0}
    tokens, parents, depths, ranks, scores = [root_token], [-1], [0], [-1], [0.0]
    by_depth: dict[int, list[int]] = {}
    for i, node in enumerate(chosen):
        by_depth.setdefault(node[0], []).append(i)
    for d in sorted(by_depth):
        level = sorted(by_depth[d], key=lambda i: (new_index[chosen[i][2]], chosen[i][1]))
        for i in level:
            depth0, rank, parent, score = chosen[i]
            new_index[i] = len(tokens)
            tokens.append(top_ids[depth0][rank])
            parents.append(new_index[parent])
            depths.append(depth0 + 1)
            ranks.append(rank)
            scores.append(score)
    return DraftTree(
        tokens=torch.tensor(tokens, dtype=torch.long),
        parents=torch.tensor(parents, dtype=torch.long),
        depths=torch.tensor(depths, dtype=torch.long),
        ranks=torch.tensor(ranks, dtype=torch.long),
        scores=torch.tensor(scores, dtype=torch.float64),
    )


def chain_tree(tokens: list[int] | torch.Tensor, root_token: int) -> DraftTree:
    """A linear tree: the root followed by `tokens` (the DFlash baseline verifies this)."""
    toks = [root_token] + [int(t) for t in (tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens)]
    n = len(toks)
    return DraftTree(
        tokens=torch.tensor(toks, dtype=torch.long),
        parents=torch.arange(-1, n - 1, dtype=torch.long),
        depths=torch.arange(n, dtype=torch.long),
        ranks=torch.tensor([-1] + [0] * (n - 1), dtype=torch.long),
        scores=torch.zeros(n, dtype=torch.float64),
    )


def spine_of(tree: DraftTree) -> DraftTree:
    """The top-1 chain of a tree: from the root, follow each node's rank-0 child."""
    parents = tree.parents.tolist()
    ranks = tree.ranks.tolist()
    keep = [0]
    for i in range(1, tree.num_nodes):
        if parents[i] == keep[-1] and ranks[i] == 0:
            keep.append(i)
    idx = torch.tensor(keep, dtype=torch.long)
    n = len(keep)
    return DraftTree(
        tokens=tree.tokens[idx],
        parents=torch.arange(-1, n - 1, dtype=torch.long),
        depths=tree.depths[idx],
        ranks=tree.ranks[idx],
        scores=tree.scores[idx],
    )


def compile_tree(tree: DraftTree, prefix_len: int) -> CompiledTree:
    """Ancestor-only attention mask, positions (prefix_len + depth) and child/sibling links.

    Args:
        tree: a DraftTree (depth-major: every parent precedes its children).
        prefix_len: tokens already in the target's cache; the root sits at this position.

    With DDTREE_KERNELS=triton, or a tree on CUDA, kernels/tree_mask's kernel compiles it.
    """
    if use_kernel(tree.parents):
        return _compile_with_kernel(tree, prefix_len)
    n = tree.num_nodes
    parents = tree.parents.tolist()
    first_child = [-1] * n
    next_sibling = [-1] * n
    last_child = [-1] * n
    for i in range(n):
        p = parents[i]
        if p >= i:
            raise BadInputError(f"tree is not depth-major: node {i} has parent {p}")
        if p >= 0:
            if first_child[p] < 0:
                first_child[p] = i
            else:
                next_sibling[last_child[p]] = i
            last_child[p] = i
    return CompiledTree(
        tree=tree,
        attention_mask=ancestor_mask(parents),
        positions=tree.depths + prefix_len,
        parents=tree.parents.clone(),
        first_child=torch.tensor(first_child, dtype=torch.long),
        next_sibling=torch.tensor(next_sibling, dtype=torch.long),
    )


def _compile_with_kernel(tree: DraftTree, prefix_len: int) -> CompiledTree:
    device = tree.parents.device
    parents = tree.parents.to(torch.long)
    if bool((parents >= torch.arange(tree.num_nodes, device=device)).any()):
        bad = int(torch.nonzero(parents >= torch.arange(tree.num_nodes, device=device))[0, 0])
        raise BadInputError(f"tree is not depth-major: node {bad} has parent {int(parents[bad])}")
    num_nodes = torch.tensor([tree.num_nodes], device=device)
    mask, _, positions, first_child, next_sibling = tree_mask.compile_tree_arrays(
        parents, tree.depths.to(torch.long), num_nodes, torch.tensor([prefix_len], device=device), tree.max_depth
    )
    return CompiledTree(
        tree=tree,
        attention_mask=mask,
        positions=positions,
        parents=tree.parents.clone(),
        first_child=first_child,
        next_sibling=next_sibling,
    )
