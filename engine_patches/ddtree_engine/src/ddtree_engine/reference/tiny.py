"""Tiny randomly initialised target/drafter pairs in Hugging Face format, for tests and the lab."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..errors import BadInputError
from .dflash import DFlashDraftModel
from .tokenizer import MASK, save_byte_tokenizer

ARCHES = ("qwen3", "qwen3-next", "qwen3.5")
# Qwen3-Next's 3:1 pattern of Gated-DeltaNet and attention layers.
HYBRID_LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
# Qwen3.5 (dense, `qwen3_5_text`) has the same 3:1 pattern, but SGLang builds its layers from
# `full_attention_interval` alone (layer i is attention iff (i + 1) % interval == 0) and ignores
# `layer_types`: the two must agree, so both are derived from this one number.
QWEN35_FULL_ATTENTION_INTERVAL = 4


def interval_layer_types(num_layers: int, interval: int) -> list[str]:
    """The layer pattern SGLang's Qwen3.5 config derives from `full_attention_interval`.

    Args:
        num_layers: decoder layers.
        interval: every `interval`-th layer (1-based) is full attention, the others Gated-DeltaNet.

    Returns:
        `layer_types` for a Hugging Face config, e.g. 4 layers, interval 4: 3 linear then 1 full.
    """
    if interval < 1:
        raise BadInputError(f"full_attention_interval must be >= 1, got {interval}")
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]


def target_config(arch: str, vocab_size: int, hidden_size: int = 64, num_layers: int = 4, **overrides):
    from transformers import Qwen3_5TextConfig, Qwen3Config, Qwen3NextConfig

    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=258,
        pad_token_id=256,
        bos_token_id=None,
    )
    common.update(overrides)
    if arch == "qwen3":
        return Qwen3Config(**{k: v for k, v in common.items() if not k.startswith("linear_")})
    if arch in ("qwen3-next", "qwen3.5"):
        if arch == "qwen3.5":
            layer_types = interval_layer_types(num_layers, QWEN35_FULL_ATTENTION_INTERVAL)
        else:
            layer_types = (HYBRID_LAYER_TYPES * num_layers)[:num_layers]
            layer_types[-1] = "full_attention"
        hybrid = dict(
            layer_types=layer_types,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=hidden_size // 4,
            linear_value_head_dim=hidden_size // 4,
            linear_conv_kernel_dim=4,
            num_experts=0,
            mlp_only_layers=[],
        )
        hybrid.update({k: common.pop(k) for k in list(common) if k in hybrid})
        if arch == "qwen3.5":
            for moe_only in ("num_experts", "mlp_only_layers"):  # Qwen3.5 dense has no MoE fields
                hybrid.pop(moe_only)
            return Qwen3_5TextConfig(**common, **hybrid, full_attention_interval=QWEN35_FULL_ATTENTION_INTERVAL)
        return Qwen3NextConfig(**common, **hybrid)
    raise BadInputError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHES)}")


def draft_config(target_cfg, mask_token_id: int, block_size: int = 16, num_layers: int = 1, target_layer_ids=None):
    from transformers import Qwen3Config

    n = target_cfg.num_hidden_layers
    layer_ids = target_layer_ids or sorted({max(0, n // 4), max(0, n - 2)})
    cfg = Qwen3Config(
        vocab_size=target_cfg.vocab_size,
        hidden_size=target_cfg.hidden_size,
        intermediate_size=2 * target_cfg.hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=target_cfg.hidden_size // 4,
        max_position_embeddings=target_cfg.max_position_embeddings,
        tie_word_embeddings=False,
    )
    cfg.architectures = ["DFlashDraftModel"]
    cfg.num_target_layers = n
    cfg.dflash_config = {"block_size": block_size, "mask_token_id": mask_token_id, "target_layer_ids": layer_ids}
    return cfg


def save_drafter(model: DFlashDraftModel, out_dir: Path) -> None:
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    model.config.to_json_file(str(out_dir / "config.json"))
    state = {k: v.contiguous() for k, v in model.state_dict().items() if "rotary_emb" not in k}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


# Hugging Face initialises a Gated-DeltaNet's decay rate A = exp(A_log) uniformly in [0.01, 16]
# with dt_bias 1, so a random layer keeps about 1e-4 of its recurrent state per token: the
# state barely reaches the output and a wrong state goes unnoticed. With A = 0.05 and
# dt_bias 0 a token keeps exp(-0.05 * softplus(a)), about 0.97 for the small `a` of a
# random projection: the state carries the output across tens of tokens.
SLOW_GDN_DECAY = 0.05


def set_gdn_decay(model: torch.nn.Module, rate: float = SLOW_GDN_DECAY) -> int:
    """Set every Gated-DeltaNet layer's decay to g = -rate * softplus(a) (A_log = log rate,
    dt_bias = 0), in place.

    Args:
        model: a loaded `*ForCausalLM` (layers without `linear_attn` are left alone).
        rate: the decay rate A, > 0; small keeps more state per token.

    Returns:
        The number of layers changed (0 for an attention-only model).
    """
    if rate <= 0:
        raise BadInputError(f"GDN decay rate must be > 0, got {rate}")
    changed = 0
    with torch.no_grad():
        for layer in model.model.layers:
            gdn = getattr(layer, "linear_attn", None)
            if gdn is not None:
                gdn.A_log.fill_(math.log(rate))
                gdn.dt_bias.zero_()
                changed += 1
    return changed


def make_tiny_pair(
    out_dir: str | Path,
    arch: str = "qwen3",
    seed: int = 0,
    block_size: int = 16,
    gdn_decay: float | None = None,
) -> tuple[Path, Path]:
    """Write OUT/target and OUT/draft (random weights, byte-level tokenizer).

    Args:
        out_dir: the directory to write (created).
        arch: one of ARCHES.
        seed: torch seed for the random weights.
        block_size: the drafter's block size.
        gdn_decay: if set, the hybrid target's Gated-DeltaNet decay rate (see `set_gdn_decay`;
            tests use SLOW_GDN_DECAY so the recurrent state shapes the output); None keeps
            Hugging Face's initialisation. The weights drawn are the same either way.

    Returns:
        (target_dir, draft_dir).
    """
    from transformers import AutoModelForCausalLM

    if arch not in ARCHES:
        raise BadInputError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHES)}")
    if block_size < 2:
        raise BadInputError(f"block size must be >= 2, got {block_size}")
    out = Path(out_dir)
    target_dir, draft_dir = out / "target", out / "draft"
    torch.manual_seed(seed)
    tok = save_byte_tokenizer(target_dir)
    tcfg = target_config(arch, vocab_size=len(tok))
    target = AutoModelForCausalLM.from_config(tcfg)
    if gdn_decay is not None:
        set_gdn_decay(target, gdn_decay)
    target.save_pretrained(str(target_dir))
    dcfg = draft_config(tcfg, mask_token_id=tok.convert_tokens_to_ids(MASK), block_size=block_size)
    drafter = DFlashDraftModel(dcfg)
    save_drafter(drafter, draft_dir)
    tok.save_pretrained(str(draft_dir))
    return target_dir, draft_dir
