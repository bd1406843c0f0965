"""Rotary position embedding, applied the Qwen3 / Qwen3-Next way (the target and the drafter share it)."""

from __future__ import annotations

import torch


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first `rot` channels of `x` by the angles in `cos`/`sin`; pass the rest through.

    Args:
        x: [B, H, T, D] queries or keys.
        cos, sin: [B, T, rot] from the model's rotary embedding, rot <= D (Qwen3-Next rotates
            only part of each head: partial rotary).

    Returns:
        [B, H, T, D], the same dtype as `x`.
    """
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, T, rot]
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated_half = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
    return torch.cat([x_rot * cos + rotated_half * sin, x_pass], dim=-1)
