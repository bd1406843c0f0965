"""How a verified tree's accepted path is committed into SGLang's per-request KV window.

Pure torch (no sglang), so it is tested on the CPU: tests/ddtree_engine/sglang_plugin/test_commit.py.

The verify wrote node j's KV into the slot at position prefix + j of the request's window. After
the walk, positions prefix .. prefix + commit_len - 1 must hold the accepted nodes' KV in path
order. Rather than copy KV (every layer), the window's slot ids are permuted: accepted nodes'
slots first, in path order, then the other slots in index order. The slot set is unchanged, so
SGLang's over-allocated reservation for the request stays exact.
"""

from __future__ import annotations

import torch


def window_order(path: torch.Tensor, commit_lens: torch.Tensor) -> torch.Tensor:
    """The permutation of each request's W window rows that puts the accepted path first.

    Args:
        path: [bs, W] int64, accepted node indices from the root (path[:, 0] == 0), then anything.
        commit_lens: [bs], how many entries of each row of `path` are accepted (>= 1).

    Returns:
        [bs, W] int64 `order`: order[:, t] = path[:, t] for t < commit_len, then the remaining
        node indices ascending. Gathering the window's slot ids (or any per-node array) with it
        gives the committed layout.
    """
    bs, width = path.shape
    idx = torch.arange(width, device=path.device)
    accepted = idx.unsqueeze(0) < commit_lens.to(torch.int64).unsqueeze(1)
    nodes = torch.where(accepted, path.to(torch.int64), 0)
    # Sort key: an accepted node's position along the path; W + index for the others. Scattering
    # only accepted entries (others scatter a no-op max) keeps node 0's key at 0.
    key = width + idx.expand(bs, width).clone()
    key.scatter_reduce_(1, nodes, torch.where(accepted, idx.expand(bs, width), 2 * width), reduce="amin")
    return torch.argsort(key, dim=1, stable=True)


def last_accepted_row(path: torch.Tensor, commit_lens: torch.Tensor) -> torch.Tensor:
    """The tree row whose intermediate hybrid state is committed: path[commit_len - 1].

    Args:
        path: [bs, W] accepted node indices; commit_lens: [bs] accepted entries per row.

    Returns:
        [bs] int64 row indices (a chain's would be commit_len - 1; a tree's is the node's row).
    """
    return torch.gather(path.to(torch.int64), 1, (commit_lens.to(torch.int64) - 1).unsqueeze(1)).squeeze(1)


def flattened_links(bs: int, width: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """First-child / next-sibling links that make every row the child of the row before it.

    The `unsafe` hybrid mode: SGLang's GDN / conv kernels then carry each row's recurrent state
    and conv window from the previous row of the flattened tree, not from its parent, which is
    the sibling leakage the mode exists to reproduce (attention still sees the tree mask).

    Returns:
        (first_child, next_sibling), [bs, width] int64 each: first_child[:, j] = j + 1 (-1 on the
        last row), next_sibling all -1.
    """
    idx = torch.arange(width, dtype=torch.int64, device=device)
    first_child = torch.where(idx + 1 < width, idx + 1, torch.full_like(idx, -1))
    return first_child.expand(bs, width).clone(), torch.full((bs, width), -1, dtype=torch.int64, device=device)


def parents_from_links(first_child: torch.Tensor, next_sibling: torch.Tensor) -> torch.Tensor:
    """The parent row the links give each row (-1 for the root): the reading SGLang's kernels make.

    Args:
        first_child, next_sibling: [bs, width] links (-1 for none).

    Returns:
        [bs, width] int64 parents.
    """
    bs, width = first_child.shape
    parents = torch.full((bs, width), -1, dtype=torch.int64)
    for b in range(bs):
        for node in range(width):
            child = int(first_child[b, node])
            while child >= 0:
                parents[b, child] = node
                child = int(next_sibling[b, child])
    return parents
