"""Token choice from logits (pure functions)."""

from __future__ import annotations

import torch


def choose_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """The target's choice for every row of `logits` [T, V] -> [T] (on the CPU).

    T=0: argmax (ties to the lowest id). T>0: one independent sample per row from
    softmax(logits / T), drawn with `generator`.
    """
    if temperature <= 0:
        return logits.argmax(dim=-1).cpu()
    probs = torch.softmax(logits.double() / temperature, dim=-1).cpu()
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
