"""The tree causal-conv1d update in SGLang's verify layout (cache lines, intermediate windows, parent links).

The same arrays as SGLang 0.5.23's `causal_conv1d_update` on its tree path, from a kernel whose code
does not grow with the verify rows (`kernel.py`; SGLang's compiles for minutes at budget >= 128).
`tree_conv_update` runs the kernel on CUDA tensors when triton imports and the reference
(`reference.py`) elsewhere; `DDTREE_KERNELS` forces a side (kernels/dispatch.py). The SGLang plugin
routes DDTREE's hybrid verify through it unless `DDTREE_SGLANG_TREE_CONV=0` (sglang_plugin/tree_conv.py).
"""

from __future__ import annotations

import torch

from ..dispatch import kernel_module, use_kernel
from . import reference
from .reference import tree_parents

__all__ = ["tree_conv_update", "tree_parents"]


def tree_conv_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    silu: bool,
    conv_state_indices: torch.Tensor | None,
    intermediate_conv_window: torch.Tensor | None,
    intermediate_state_indices: torch.Tensor | None,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    retrieve_parent_token: torch.Tensor,
    pad_slot_id: int = -1,
    pdl: bool = False,
) -> torch.Tensor:
    """Conv outputs [B, C, T] of the verify rows; conv_state, the windows and the parents written in place.

    Arguments as `reference.tree_conv_update`; pdl: launch with programmatic dependent launch (the kernel only).
    """
    args = (x, conv_state, weight, bias, silu, conv_state_indices, intermediate_conv_window,
            intermediate_state_indices, retrieve_next_token, retrieve_next_sibling, retrieve_parent_token, pad_slot_id)
    if use_kernel(x):
        return kernel_module(__name__).tree_conv_update(*args, pdl=pdl)
    return reference.tree_conv_update(*args)
