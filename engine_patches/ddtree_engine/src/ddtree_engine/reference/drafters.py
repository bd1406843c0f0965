"""Drafters: what proposes per-depth distributions for the tree.

A drafter sees the committed tokens' target features (`observe`) and, for a root token at a
position, returns logits [L, V] for the L positions after it (`propose`).
"""

from __future__ import annotations

from typing import Protocol

import torch

from .dflash import DFlashDraftModel


class Drafter(Protocol):
    block_size: int
    capture_layers: list[int]

    def reset(self) -> None: ...

    def observe(self, token_ids: list[int], features: torch.Tensor | None, positions: torch.Tensor) -> None: ...

    def propose(self, root_token: int, root_position: int, num_positions: int) -> torch.Tensor: ...


class DFlashDrafter:
    """The DFlash drafter bound to its target's embedding and LM head, with a context cache."""

    def __init__(self, model: DFlashDraftModel, target_model: torch.nn.Module):
        self.model = model.eval()
        self.embed = target_model.get_input_embeddings()
        self.lm_head = target_model.get_output_embeddings()
        self.block_size = model.block_size
        self.capture_layers = list(model.target_layer_ids)
        self.reset()

    def reset(self) -> None:
        self._ctx: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    @torch.inference_mode()
    def observe(self, token_ids: list[int], features: torch.Tensor | None, positions: torch.Tensor) -> None:
        new = self.model.context_kv(features, positions.to(features.device))
        if self._ctx is None:
            self._ctx = new
        else:
            self._ctx = [
                (torch.cat([k, nk], dim=2), torch.cat([v, nv], dim=2)) for (k, v), (nk, nv) in zip(self._ctx, new)
            ]

    @torch.inference_mode()
    def propose(self, root_token: int, root_position: int, num_positions: int) -> torch.Tensor:
        if self._ctx is None:
            raise RuntimeError("the drafter has no context yet: observe the prompt first")
        device = self.embed.weight.device
        block = torch.full((self.block_size,), self.model.mask_token_id, dtype=torch.long, device=device)
        block[0] = root_token
        noise = (self.embed(block) * self.model.input_embedding_scale).unsqueeze(0)
        positions = torch.arange(root_position, root_position + self.block_size, device=device)
        hidden = self.model.forward_block(noise, positions, self._ctx)
        return self.model.logits(hidden[0, 1 : 1 + num_positions], self.lm_head).float()
