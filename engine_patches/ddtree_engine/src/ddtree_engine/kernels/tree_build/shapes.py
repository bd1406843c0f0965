"""Which shapes the build kernels take, in plain Python: the package asks before it imports Triton."""

from __future__ import annotations

KEY_BITS = 56  # rank-path bits below the depth in the layout key (layout.py)
MAX_BUDGET_AND_K = 4096  # the int64 frontier key's slot and rank fields (kernel.py: INT64_KEYS)


def rank_bits(k: int) -> int:
    """Bits per tree level of the layout key: enough for ranks 0 .. k - 1 (at least 1)."""
    return max(1, (k - 1).bit_length())


def supports(depths: int, k: int, budget: int) -> bool:
    """Whether the kernel takes this shape: the layout key must fit (B * L <= 56 bits), and
    the frontier's slot and counter fields their 12 and 20 bits."""
    return rank_bits(k) * depths <= KEY_BITS and budget < MAX_BUDGET_AND_K and k < MAX_BUDGET_AND_K
