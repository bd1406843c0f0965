"""Best-first draft-tree build over the per-depth top-K (core.tree.build_tree's selection).

`build_tree_arrays` returns fixed-shape arrays (N = budget + 1, padding after num_nodes): the
Triton kernel (`kernel.py`, one program, no host sync) on CUDA when triton imports, the
reference (`reference.py`, a heap on the host) elsewhere; `DDTREE_KERNELS` forces a side
(kernels/dispatch.py). Shapes the kernel cannot lay out (ceil(log2 K) * L > 56) go to the
reference.
"""

from __future__ import annotations

import torch

from ..dispatch import kernel_module, use_kernel
from ..topk_logprobs import sorted_topk_logprobs
from . import reference
from .shapes import supports as kernel_supports

__all__ = ["build_tree_arrays", "kernel_supports", "root_only"]


def root_only(root: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tree of the root alone (budget 0, or nothing drafted), from a [1] root tensor."""
    long = dict(dtype=torch.int64, device=root.device)
    return (
        root.to(torch.int64).reshape(1).clone(),
        torch.full((1,), -1, **long),
        torch.zeros(1, **long),
        torch.full((1,), -1, **long),
        torch.zeros(1, dtype=torch.float64, device=root.device),
        torch.ones(1, **long),
    )


def build_tree_arrays(
    draft_logits: torch.Tensor, budget: int, topk: int, root_token: int | torch.Tensor, spine_depth: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-K per depth, then the `budget` most probable prefixes, as fixed-shape arrays.

    Args:
        draft_logits: [L, V] drafter logits.
        budget: drafted nodes (>= 0); topk: candidates per depth, K = min(topk, budget, V).
        root_token: the token at node 0 (an int, or a [1] tensor on the logits' device, which the
            kernel reads without a host sync).
        spine_depth: reserve the top-1 chain down to this depth first.

    Returns:
        (tokens, parents, depths, ranks [N] int64, scores [N] float64, num_nodes [1] int64) with
        N = budget + 1 when anything is drafted (else 1), on the logits' device.
    """
    depths, vocab = draft_logits.shape
    k = min(topk, budget, vocab)
    device = draft_logits.device
    root = root_token if isinstance(root_token, torch.Tensor) else torch.tensor([root_token], device=device)
    if depths == 0 or k == 0:
        return root_only(root.to(device))
    vals, ids = sorted_topk_logprobs(draft_logits, k)
    if use_kernel(draft_logits) and kernel_supports(depths, k, budget):
        return kernel_module(__name__).build_tree_arrays(vals, ids, budget, root.to(device), spine_depth)
    arrays = reference.build_tree_arrays(vals.cpu(), ids.cpu(), budget, int(root.reshape(-1)[0]), spine_depth)
    return tuple(a.to(device) for a in arrays)
