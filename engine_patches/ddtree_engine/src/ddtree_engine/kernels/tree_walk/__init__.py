"""The verify walk: the accepted path, emitted tokens, commit length and bonus token.

`walk_arrays` runs the Triton kernel (`kernel.py`, one program, no host sync) on CUDA when
triton imports and the reference (`reference.py`) elsewhere; `DDTREE_KERNELS` forces a side
(kernels/dispatch.py).
"""

from __future__ import annotations

import torch

from ..dispatch import kernel_module, use_kernel
from . import reference

__all__ = ["walk_arrays"]


def walk_arrays(
    tokens: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor, target_choice: torch.Tensor, max_depth: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Follow the target's choices from the root.

    Args:
        tokens, parents: [N] int64 tree arrays; num_nodes: [1] int64 (real nodes).
        target_choice: [N] the target's token at every node (argmax at T=0, a sample at T>0).
        max_depth: a bound on the tree's depth.

    Returns:
        (path [N], emitted [N], commit_len [1], bonus [1]) int64, as
        tree_walk.reference.walk_arrays, on the tree's device.
    """
    if use_kernel(tokens):
        choice = target_choice.to(tokens.device)
        return kernel_module(__name__).walk_arrays(tokens, parents, num_nodes, choice, max_depth)
    out = reference.walk_arrays(tokens.cpu(), parents.cpu(), int(num_nodes.reshape(-1)[0]), target_choice.cpu())
    return tuple(a.to(tokens.device) for a in out)
