"""Per-depth log-probabilities and their sorted top-K (the tree builder's candidates).

`sorted_topk_logprobs` runs the Triton kernel (`kernel.py`) on CUDA fp32/bf16/fp16 logits when
triton imports and the reference (`reference.py`) elsewhere; `DDTREE_KERNELS` forces a side
(see kernels/dispatch.py). The kernel takes no float64 logits: those always go to the reference.
"""

from __future__ import annotations

import torch

from ..dispatch import kernel_module, use_kernel
from . import reference

__all__ = ["sorted_topk_logprobs"]

_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def sorted_topk_logprobs(draft_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` most probable tokens per row of `draft_logits`, best first.

    Args:
        draft_logits: [L, V] the drafter's logits for the L positions after the root.
        k: candidates per row, 1 <= k <= V.

    Returns:
        (logprobs [L, k] float64, token_ids [L, k] long) on the logits' device; ties go to the
        lower token id.
    """
    if draft_logits.dtype in _KERNEL_DTYPES and use_kernel(draft_logits):
        return kernel_module(__name__).topk_logprobs(draft_logits, k)
    return reference.sorted_topk_logprobs(draft_logits, k)
