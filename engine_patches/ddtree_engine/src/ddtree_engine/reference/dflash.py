"""A DFlash block-diffusion drafter that loads the z-lab checkpoint format.

Format (as z-lab's `DFlashDraftModel` and the `dflash` package save it): a Qwen3 config with
`dflash_config: {block_size, mask_token_id, target_layer_ids}` and `num_target_layers`; weights
`fc.weight` [H, n_ctx * H], `hidden_norm.weight`, `norm.weight`, and `layers.{i}.self_attn.*`,
`layers.{i}.mlp.*`, `layers.{i}.{input,post_attention}_layernorm.weight`. The drafter has no
embedding or LM head of its own: it uses the target's.

In one pass it turns the block [anchor, mask, ..., mask] (block_size tokens, positions
start..start+B-1) into logits for the B-1 positions after the anchor, attending without a
causal mask to the target's hidden features of every committed token (kept as a KV cache)
and to the whole block.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding

from .rotary import apply_rotary


def draft_setting(config: Qwen3Config, name: str, default=None):
    block = getattr(config, "dflash_config", None) or {}
    return block.get(name, getattr(config, name, default))


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's spread of context layers over the target's depth."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [round(start + (i * span) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


class DFlashAttention(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def project_kv(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, T, H] -> k, v [B, Hkv, T, D] with rotary applied to k."""
        b, t = x.shape[:2]
        k = self.k_norm(self.k_proj(x).view(b, t, -1, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = apply_rotary(k, cos, sin)
        return k, v

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask: torch.Tensor | None = None):
        """x [B, T, H] block; ctx_k/v [B, Hkv, S, D]; mask [B, T, S + T] (True = attend) or None (all)."""
        b, t = x.shape[:2]
        q = self.q_norm(self.q_proj(x).view(b, t, -1, self.head_dim)).transpose(1, 2)
        q = apply_rotary(q, cos, sin)
        k_noise, v_noise = self.project_kv(x, cos, sin)
        k = torch.cat([ctx_k, k_noise], dim=2)
        v = torch.cat([ctx_v, v_noise], dim=2)
        groups = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scaling
        if mask is not None:
            scores = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(v.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out)


class DFlashLayer(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.self_attn = DFlashAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class DFlashDraftModel(nn.Module):
    """The drafter network. Parameter names match z-lab's checkpoints."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(DFlashLayer(config, i) for i in range(config.num_hidden_layers))
        self.target_layer_ids = list(
            draft_setting(
                config,
                "target_layer_ids",
                default_target_layer_ids(config.num_target_layers, config.num_hidden_layers),
            )
        )
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.fc = nn.Linear(len(self.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.block_size = int(draft_setting(config, "block_size", 16))
        self.mask_token_id = int(draft_setting(config, "mask_token_id"))
        self.input_embedding_scale = float(draft_setting(config, "input_embedding_scale", 1.0))
        self.output_multiplier = float(draft_setting(config, "output_multiplier", 1.0))
        self.softcap = draft_setting(config, "final_logit_softcapping", None)

    def rotary(self, x: torch.Tensor, positions: torch.Tensor):
        return self.rotary_emb(x, positions if positions.dim() == 2 else positions.unsqueeze(0))

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer K/V [B, Hkv, T, D] of context features [T, F] or [B, T, F] at `positions`."""
        if features.dim() == 2:
            features = features.unsqueeze(0)
        ctx = self.hidden_norm(self.fc(features))
        cos, sin = self.rotary(ctx, positions)
        return [layer.self_attn.project_kv(ctx, cos, sin) for layer in self.layers]

    def forward_block(self, noise: torch.Tensor, positions: torch.Tensor, ctx_kv, mask: torch.Tensor | None = None):
        """noise [B, T, H] embeddings of the block(s) -> hidden [B, T, H]. Without `mask` every
        block query sees all context and the whole block (inference); training packs several
        blocks and passes which context and block keys each query may see."""
        h = noise
        cos, sin = self.rotary(h, positions)
        for layer, (ck, cv) in zip(self.layers, ctx_kv):
            residual = h
            h = residual + layer.self_attn(layer.input_layernorm(h), cos, sin, ck, cv, mask)
            residual = h
            h = residual + layer.mlp(layer.post_attention_layernorm(h))
        return self.norm(h)

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        logits = lm_head(hidden) * self.output_multiplier
        if self.softcap:
            logits = torch.tanh(logits / float(self.softcap)) * float(self.softcap)
        return logits
