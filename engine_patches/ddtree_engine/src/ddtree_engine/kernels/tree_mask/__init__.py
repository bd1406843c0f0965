"""The ancestor-only attention mask of a draft tree, and the whole verify compile.

`ancestor_mask` (a parent list, on the CPU) is the reference's. `compile_tree_arrays` (mask,
packed mask, positions, child/sibling links of a fixed-shape tree) runs the Triton kernel
(`kernel.py`) on CUDA when triton imports and the reference elsewhere; `DDTREE_KERNELS`
forces a side (kernels/dispatch.py). `flat_verify_mask` lays a batch's row blocks out as SGLang's
flat TARGET_VERIFY custom mask, straight into SGLang's buffer (the kernel reads the prefix lengths
on the device, so the DDTREE tree step's CUDA graph holds it).
"""

from __future__ import annotations

import torch

from ..dispatch import kernel_module, use_kernel
from . import reference
from .reference import ancestor_mask, pack_mask

__all__ = ["ancestor_mask", "compile_tree_arrays", "flat_verify_mask", "pack_mask"]


def compile_tree_arrays(
    parents: torch.Tensor, depths: torch.Tensor, num_nodes: torch.Tensor, prefix_len: torch.Tensor, max_depth: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mask [N, N], packed mask [N, ceil(N/32)] int32, positions, first_child, next_sibling.

    Args:
        parents, depths: [N] int64, depth-major, padding from num_nodes on.
        num_nodes, prefix_len: [1] int64 tensors on the tree's device.
        max_depth: a bound on the tree's depth.

    Returns:
        As tree_mask.reference.compile_tree_arrays, on the tree's device.
    """
    if use_kernel(parents):
        return kernel_module(__name__).compile_tree_arrays(parents, depths, num_nodes, prefix_len, max_depth)
    out = reference.compile_tree_arrays(parents.cpu(), depths.cpu(), int(num_nodes.reshape(-1)[0]), int(prefix_len.reshape(-1)[0]))
    return tuple(a.to(parents.device) for a in out)


def flat_verify_mask(block: torch.Tensor, prefix: torch.Tensor, out: torch.Tensor) -> None:
    """Write the flat verify mask of `block` [bs, C, C] bool after `prefix` [bs] into `out` [M] from
    its start (tree_mask.reference.flat_verify_mask: the layout; cells past out's end unwritten)."""
    if use_kernel(block):
        kernel_module(__name__).flat_verify_mask(block, prefix, out)
    else:
        reference.flat_verify_mask(block, prefix, out)
