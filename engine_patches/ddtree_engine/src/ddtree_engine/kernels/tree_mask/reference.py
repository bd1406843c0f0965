"""Reference: each node may attend to itself and its ancestors, nothing else in the tree."""

from __future__ import annotations

import torch


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """[N, N] bool, True where node i may attend to node j (j is i or an ancestor of i).

    Args:
        parents: [N] parent index per node, -1 for a root; every parent precedes its children
            (depth-major order), which lets row i copy its parent's row.

    Returns:
        The mask on the CPU.
    """
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= i:
            raise ValueError(f"expected parents to precede their children, got node {i} with parent {p}")
        if p >= 0:
            mask[i] = mask[p]
        mask[i, i] = True
    return mask


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """[N, N] bool -> [N, ceil(N / 32)] int32: bit b of word w is column 32 * w + b.

    Args:
        mask: [N, N] bool.

    Returns:
        The packed rows (int32 words, so bit 31 is the sign bit).
    """
    n = mask.shape[0]
    words = (n + 31) // 32
    padded = torch.zeros(n, words * 32, dtype=torch.int64)
    padded[:, : mask.shape[1]] = mask.to(torch.int64)
    weights = torch.tensor([1 << b for b in range(32)], dtype=torch.int64)
    packed = (padded.view(n, words, 32) * weights).sum(dim=-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def compile_tree_arrays(
    parents: torch.Tensor, depths: torch.Tensor, num_nodes: int, prefix_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a verify forward needs, for a tree padded to a fixed N (the kernel's shape).

    Args:
        parents: [N] parent per node (-1 for the root), depth-major; rows from `num_nodes` on
            are padding and are ignored.
        depths: [N] depth per node.
        num_nodes: the real nodes, 1 <= num_nodes <= N.
        prefix_len: tokens already in the cache (the root's position).

    Returns:
        (mask [N, N] bool, packed mask [N, ceil(N/32)] int32, positions [N] int64,
        first_child [N] int64, next_sibling [N] int64). A padding row sees only itself, sits at
        prefix_len, and has no links; no real node links to it.
    """
    n_out = parents.shape[0]
    plist = parents.tolist()[:num_nodes]
    mask = torch.zeros(n_out, n_out, dtype=torch.bool)
    mask[:num_nodes, :num_nodes] = ancestor_mask(plist)
    for i in range(num_nodes, n_out):
        mask[i, i] = True
    first_child = [-1] * n_out
    next_sibling = [-1] * n_out
    last_child = [-1] * n_out
    for i, p in enumerate(plist):
        if p >= 0:
            if first_child[p] < 0:
                first_child[p] = i
            else:
                next_sibling[last_child[p]] = i
            last_child[p] = i
    positions = torch.full((n_out,), prefix_len, dtype=torch.long)
    positions[:num_nodes] += depths[:num_nodes].to(torch.long).cpu()
    long = dict(dtype=torch.long)
    return mask, pack_mask(mask), positions, torch.tensor(first_child, **long), torch.tensor(next_sibling, **long)


def flat_custom_mask(blocks: list[torch.Tensor], prefix_lens: list[int]) -> torch.Tensor:
    """SGLang's flat TARGET_VERIFY custom mask from each request's rows-among-rows block
    (sglang_plugin.padding builds its tree masks with it).

    Args:
        blocks: per request, a [C, C] bool block (who among the C rows each row sees).
        prefix_lens: per request, the committed prefix length (host ints); every row sees it all.

    Returns:
        Per request the row-major [C, prefix + C] block (the prefix all True), concatenated.
    """
    parts = []
    for block, prefix in zip(blocks, prefix_lens):
        seen = torch.ones((block.shape[0], prefix), dtype=torch.bool, device=block.device)
        parts.append(torch.cat([seen, block], dim=1).reshape(-1))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def flat_verify_mask(block: torch.Tensor, prefix: torch.Tensor, out: torch.Tensor) -> None:
    """`flat_custom_mask` of a batch, written into `out` from its start: request i starts at the sum
    over j < i of C * (prefix_j + C). Cells past `out`'s end are not written (the caller checks the size).

    Args:
        block: [bs, C, C] bool, who among the C verify rows each row sees.
        prefix: [bs] or [bs, 1] integer, each request's committed prefix length.
        out: [M] flat bool or uint8 buffer (SGLang's verify-mask buffer).
    """
    if block.shape[0] == 0:
        return
    flat = flat_custom_mask(list(block), prefix.reshape(-1).tolist())
    n = min(flat.numel(), out.numel())
    out[:n] = flat[:n].to(out.dtype)
