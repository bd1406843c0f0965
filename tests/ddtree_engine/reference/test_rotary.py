"""The shared rotary helper (target and drafter) equals transformers' own `apply_rotary_pos_emb`
for full rotary (Qwen3) and partial rotary (Qwen3-Next; Qwen3.5, whose multimodal rotary gives
text tokens plain 1-D angles), at the rotary embedding's real angles."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3 import modeling_qwen3
from transformers.models.qwen3_5 import modeling_qwen3_5
from transformers.models.qwen3_next import modeling_qwen3_next

from ddtree_engine.reference.rotary import apply_rotary
from ddtree_engine.reference.tiny import target_config

MODULES = {"qwen3": modeling_qwen3, "qwen3-next": modeling_qwen3_next, "qwen3.5": modeling_qwen3_5}
ROTARY = {"qwen3": "Qwen3RotaryEmbedding", "qwen3-next": "Qwen3NextRotaryEmbedding", "qwen3.5": "Qwen3_5TextRotaryEmbedding"}


@pytest.mark.parametrize("arch", list(MODULES))
def test_apply_rotary_matches_transformers(arch):
    module = MODULES[arch]
    config = target_config(arch, vocab_size=64, hidden_size=64)
    rotary = getattr(module, ROTARY[arch])(config)
    gen = torch.Generator().manual_seed(3)
    heads, kv_heads, tokens, head_dim = 4, 2, 7, config.head_dim
    q = torch.randn(1, heads, tokens, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(1, kv_heads, tokens, head_dim, generator=gen, dtype=torch.float64)
    positions = torch.tensor([[5, 6, 6, 7, 7, 8, 30]])  # tree positions repeat across siblings
    cos, sin = rotary(q, positions)
    if arch != "qwen3":
        assert cos.shape[-1] < head_dim, "expected partial rotary on the hybrid target"
    want_q, want_k = module.apply_rotary_pos_emb(q, k, cos, sin)
    torch.testing.assert_close(apply_rotary(q, cos, sin), want_q, rtol=0, atol=0)
    torch.testing.assert_close(apply_rotary(k, cos, sin), want_k, rtol=0, atol=0)
