"""Convert the lab target (dense Qwen3-Next, `qwen3_next`) into dense Qwen3.5 (`qwen3_5_text`),
the hybrid architecture SGLang 0.5.23 loads without MoE, with the same logits.

    python training/convert_lab_pair_qwen35.py --source OLD_TARGET --out NEW_TARGET \\
        [--draft OLD_DRAFT --draft-out NEW_DRAFT] [--interval 4] [--check]

What carries over unchanged (Hugging Face 5.19 `modeling_qwen3_next.py` against
`modeling_qwen3_5.py`): embeddings, LM head, the zero-centred RMSNorms (`x * (1 + w)`, same
parameters), the gated attention (`q_proj` of width 2 * heads * head_dim, per-head
[query | gate], q/k norms, partial rotary 0.25: Qwen3.5's multimodal rotary gives 1-D RoPE for
text, whose three position rows are equal), the MLP names, and the Gated-DeltaNet's conv1d
(its channels are [all q | all k | all v] in both), A_log, dt_bias, gated norm and out_proj.

What is re-laid, by a pure row permutation (bit-exact): Qwen3-Next packs the Gated-DeltaNet's
input projections per key-head group, `in_proj_qkvz` rows [g0: q k v z | g1: q k v z | ...] and
`in_proj_ba` rows [g0: b a | ...]; Qwen3.5 keeps them flat and separate, `in_proj_qkv`
[all q | all k | all v], `in_proj_z`, `in_proj_b`, `in_proj_a` (SGLang's qwen3_5 loader reads
exactly these four names and splits nothing per group).

What has to be added: SGLang builds a Qwen3.5 model's layers from `full_attention_interval`
alone (layer i is attention iff (i + 1) % interval == 0) and ignores `layer_types`. The lab
target's pattern [L L L F L F] has no such interval, so each source layer is placed at the next
slot of its kind in the periodic pattern and the slots skipped are filled with identity layers:
every projection zero, so the layer adds exactly 0 to the residual stream (the attention output
is 0 * sigmoid(0), the Gated-DeltaNet output and the MLP output are products with a zero
matrix). With interval 4 the lab target becomes [L L L F L L* L* F] (*: identity), source
layer i keeps index i for i < 5, and the drafter's target_layer_ids [1, 4] stay as they are.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "engine_patches" / "ddtree_engine" / "src"))

from ddtree_engine.reference.tiny import interval_layer_types  # noqa: E402

LINEAR, FULL = "linear_attention", "full_attention"
# Files of a model directory copied as they are (tokenizer, chat template, generation defaults).
COPIED = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
          "special_tokens_map.json")


class ConversionError(ValueError):
    """The source cannot be converted exactly; the message says why and what to change."""


def layer_plan(source_types: list[str], interval: int) -> tuple[list[str], list[int]]:
    """Place each source layer at the next slot of its kind in SGLang's periodic pattern.

    Args:
        source_types: the source's `layer_types`, e.g. [L, L, L, F, L, F].
        interval: `full_attention_interval` of the result.

    Returns:
        (layer_types of the result, index in the result of each source layer). Slots not in the
        mapping are identity layers. The result ends with the last source layer.
    """
    unknown = sorted(set(source_types) - {LINEAR, FULL})
    if unknown:
        raise ConversionError(f"layer types {unknown} cannot be placed; only {LINEAR!r} and {FULL!r} can")
    if interval < 2:
        raise ConversionError(f"interval must be >= 2 to hold Gated-DeltaNet layers, got {interval}")
    mapping, slot = [], 0
    for kind in source_types:
        while interval_layer_types(slot + 1, interval)[slot] != kind:
            slot += 1
        mapping.append(slot)
        slot += 1
    return interval_layer_types(slot, interval), mapping


def _check_source(config: dict, path: Path) -> None:
    if config.get("model_type") != "qwen3_next":
        raise ConversionError(f"{path}: model_type is {config.get('model_type')!r}; this converts 'qwen3_next' only")
    sparse = config.get("num_experts", 0) and any(
        i not in set(config.get("mlp_only_layers", [])) for i in range(config["num_hidden_layers"])
    )
    if sparse:
        raise ConversionError(f"{path}: layers with MoE experts have no dense Qwen3.5 equivalent (set num_experts 0)")
    if config.get("attention_bias"):
        raise ConversionError(f"{path}: attention_bias is set; Qwen3.5 checkpoints carry no attention biases")
    if config.get("tie_word_embeddings"):
        raise ConversionError(f"{path}: tied embeddings are not handled by this converter")


def target_config(source: dict, layer_types: list[str], interval: int):
    """The Qwen3.5 config of the converted target (every shape as in the source)."""
    from transformers import Qwen3_5TextConfig

    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps", "initializer_range",
            "attention_dropout", "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
            "linear_num_key_heads", "linear_num_value_heads", "bos_token_id", "eos_token_id", "pad_token_id")
    rope = dict(source.get("rope_parameters") or {})
    rope.setdefault("rope_theta", source.get("rope_theta", 10000.0))
    rope.setdefault("rope_type", "default")
    rope.setdefault("partial_rotary_factor", source.get("partial_rotary_factor", 0.25))
    config = Qwen3_5TextConfig(
        **{k: source[k] for k in keep if k in source},
        num_hidden_layers=len(layer_types),
        layer_types=layer_types,
        # Passed beside layer_types, Hugging Face keeps it in config.json, where SGLang reads it.
        full_attention_interval=interval,
        rope_parameters=rope,
        tie_word_embeddings=False,
        attention_bias=False,
    )
    config.architectures = ["Qwen3_5ForCausalLM"]
    config.dtype = source.get("dtype", "bfloat16")
    return config


def split_gdn_projections(qkvz: torch.Tensor, ba: torch.Tensor, config: dict) -> dict[str, torch.Tensor]:
    """Qwen3-Next's grouped `in_proj_qkvz` [Hk * (2 Dk + 2 r Dv), hidden] and `in_proj_ba`
    [Hk * 2r, hidden] (r = Hv / Hk) as Qwen3.5's flat `in_proj_qkv`, `in_proj_z`, `in_proj_b`,
    `in_proj_a`: rows only move, so the conversion is exact in any dtype."""
    hk, dk = config["linear_num_key_heads"], config["linear_key_head_dim"]
    hv, dv = config["linear_num_value_heads"], config["linear_value_head_dim"]
    r = hv // hk
    hidden = qkvz.shape[-1]
    expected = (hk * (2 * dk + 2 * r * dv), hidden), (hk * 2 * r, hidden)
    if (tuple(qkvz.shape), tuple(ba.shape)) != expected:
        raise ConversionError(f"in_proj_qkvz/ba shapes {tuple(qkvz.shape)}, {tuple(ba.shape)}; expected {expected}")
    q, k, v, z = qkvz.view(hk, -1, hidden).split([dk, dk, r * dv, r * dv], dim=1)
    b, a = ba.view(hk, -1, hidden).split([r, r], dim=1)
    flat = [t.reshape(-1, hidden) for t in (q, k, v, z, b, a)]
    return {
        "in_proj_qkv.weight": torch.cat(flat[:3]).contiguous(),
        "in_proj_z.weight": flat[3].contiguous(),
        "in_proj_b.weight": flat[4].contiguous(),
        "in_proj_a.weight": flat[5].contiguous(),
    }


def identity_layer(kind: str, config: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Weights of a decoder layer that adds exactly 0 to the residual stream (names without the
    `model.layers.N.` prefix): every projection zero; norms at their identity (zero-centred
    RMSNorm weight 0, the Gated-DeltaNet's gated norm 1), decay A = 1, dt_bias 1 (finite)."""
    h, inter = config["hidden_size"], config["intermediate_size"]
    zeros = lambda *shape: torch.zeros(*shape, dtype=dtype)  # noqa: E731
    out = {
        "input_layernorm.weight": zeros(h),
        "post_attention_layernorm.weight": zeros(h),
        "mlp.gate_proj.weight": zeros(inter, h),
        "mlp.up_proj.weight": zeros(inter, h),
        "mlp.down_proj.weight": zeros(h, inter),
    }
    if kind == FULL:
        d, nq, nkv = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]
        out.update({
            "self_attn.q_proj.weight": zeros(2 * nq * d, h),
            "self_attn.k_proj.weight": zeros(nkv * d, h),
            "self_attn.v_proj.weight": zeros(nkv * d, h),
            "self_attn.o_proj.weight": zeros(h, nq * d),
            "self_attn.q_norm.weight": zeros(d),
            "self_attn.k_norm.weight": zeros(d),
        })
    else:
        hk, dk = config["linear_num_key_heads"], config["linear_key_head_dim"]
        hv, dv = config["linear_num_value_heads"], config["linear_value_head_dim"]
        conv_dim = 2 * hk * dk + hv * dv
        out.update({
            f"linear_attn.{name}": t
            for name, t in {
                "in_proj_qkv.weight": zeros(conv_dim, h),
                "in_proj_z.weight": zeros(hv * dv, h),
                "in_proj_b.weight": zeros(hv, h),
                "in_proj_a.weight": zeros(hv, h),
                "conv1d.weight": zeros(conv_dim, 1, config["linear_conv_kernel_dim"]),
                "A_log": zeros(hv),
                "dt_bias": torch.ones(hv, dtype=dtype),
                "norm.weight": torch.ones(dv, dtype=dtype),
                "out_proj.weight": zeros(h, hv * dv),
            }.items()
        })
    return out


def convert_state(state: dict[str, torch.Tensor], config: dict, layer_types: list[str], mapping: list[int]):
    """The converted state dict: source layer i renamed to layer mapping[i] (Gated-DeltaNet input
    projections split), identity layers in the slots between."""
    out: dict[str, torch.Tensor] = {}
    dtype = state["model.embed_tokens.weight"].dtype
    for name, tensor in state.items():
        if not name.startswith("model.layers."):
            out[name] = tensor
            continue
        index, rest = name.removeprefix("model.layers.").split(".", 1)
        prefix = f"model.layers.{mapping[int(index)]}."
        if rest == "linear_attn.in_proj_qkvz.weight":
            ba = state[f"model.layers.{index}.linear_attn.in_proj_ba.weight"]
            for new_name, t in split_gdn_projections(tensor, ba, config).items():
                out[prefix + "linear_attn." + new_name] = t
        elif rest != "linear_attn.in_proj_ba.weight":
            out[prefix + rest] = tensor
    for slot in sorted(set(range(len(layer_types))) - set(mapping)):
        for rest, t in identity_layer(layer_types[slot], config, dtype).items():
            out[f"model.layers.{slot}.{rest}"] = t
    return out


def convert(source: Path, out: Path, interval: int = 4) -> list[int]:
    """Write the Qwen3.5 target converted from `source` to `out`.

    Args:
        source: a dense `qwen3_next` model directory (config.json, model.safetensors, tokenizer).
        out: the directory to write (created; files of the same names are replaced).
        interval: `full_attention_interval` of the result.

    Returns:
        The result's layer index of each source layer.
    """
    from safetensors.torch import load_file, save_file

    if not (source / "config.json").is_file():
        raise ConversionError(f"{source} has no config.json: pass the directory of a dense qwen3_next target")
    source_config = json.loads((source / "config.json").read_text())
    _check_source(source_config, source)
    layer_types, mapping = layer_plan(source_config["layer_types"], interval)
    state: dict[str, torch.Tensor] = {}
    for f in sorted(source.glob("*.safetensors")):
        state.update(load_file(str(f)))
    if not state:
        raise ConversionError(f"{source} has no *.safetensors weights")
    out.mkdir(parents=True, exist_ok=True)
    target_config(source_config, layer_types, interval).save_pretrained(str(out))
    save_file(convert_state(state, source_config, layer_types, mapping), str(out / "model.safetensors"),
              metadata={"format": "pt"})
    for name in COPIED:
        if (source / name).is_file():
            shutil.copyfile(source / name, out / name)
    return mapping


def remap_drafter(draft: Path, draft_out: Path, mapping: list[int], num_layers: int) -> dict:
    """Copy a DFlash drafter, pointing its target_layer_ids at the same layers in the converted
    target and its num_target_layers at the new depth; weights are copied byte for byte."""
    config = json.loads((draft / "config.json").read_text())
    dflash = config.get("dflash_config") or {}
    ids = dflash.get("target_layer_ids")
    if ids is None:
        raise ConversionError(f"{draft}: dflash_config.target_layer_ids is missing; it cannot be remapped")
    draft_out.mkdir(parents=True, exist_ok=True)
    for f in draft.iterdir():
        if f.is_file() and f.name != "config.json" and f.resolve() != (draft_out / f.name).resolve():
            shutil.copyfile(f, draft_out / f.name)
    dflash["target_layer_ids"] = [mapping[i] for i in ids]
    config["num_target_layers"] = num_layers
    (draft_out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return config


def logit_check(source: Path, out: Path, mapping: list[int], prompts: list[list[int]], dtype=torch.float32):
    """Max |Δ| between the two targets on `prompts`: Hugging Face forward logits, and the
    reference backend's features at every source layer (what a drafter reads).

    Returns:
        {"logits": max abs diff, "features": max abs diff, "logit_scale": max abs logit}.
    """
    from transformers import AutoModelForCausalLM

    from ddtree_engine.core.hybrid import flattened_parents
    from ddtree_engine.reference.target import TargetRunner

    old = AutoModelForCausalLM.from_pretrained(str(source), dtype=dtype).eval()
    new = AutoModelForCausalLM.from_pretrained(str(out), dtype=dtype).eval()
    worst = {"logits": 0.0, "features": 0.0, "logit_scale": 0.0}
    runners = TargetRunner(old), TargetRunner(new)
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            a, b = old(ids).logits[0].float(), new(ids).logits[0].float()
        worst["logits"] = max(worst["logits"], (a - b).abs().max().item())
        worst["logit_scale"] = max(worst["logit_scale"], a.abs().max().item())
        n = len(prompt)
        args = torch.tensor(prompt), flattened_parents(n), torch.arange(n)
        fa = runners[0].forward(runners[0].new_cache(), *args, capture_layers=list(range(len(mapping))), linear=True)
        fb = runners[1].forward(runners[1].new_cache(), *args, capture_layers=mapping, linear=True)
        worst["features"] = max(worst["features"], (fa.features - fb.features).abs().max().item())
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="dense qwen3_next target directory")
    parser.add_argument("--out", type=Path, required=True, help="directory for the qwen3_5_text target")
    parser.add_argument("--draft", type=Path, help="the DFlash drafter of the source target (optional)")
    parser.add_argument("--draft-out", type=Path, help="where to write the drafter with remapped layer ids")
    parser.add_argument("--interval", type=int, default=4, help="full_attention_interval (default 4, Qwen3.5's)")
    parser.add_argument("--check", action="store_true", help="compare float32 logits and features on the lab prompts")
    args = parser.parse_args(argv)
    if (args.draft is None) != (args.draft_out is None):
        parser.error("--draft and --draft-out go together")
    try:
        mapping = convert(args.source, args.out, args.interval)
        layer_types = json.loads((args.out / "config.json").read_text())["layer_types"]
        report = {"layer_types": layer_types, "source_layer_to_new": mapping}
        if args.draft is not None:
            drafter = remap_drafter(args.draft, args.draft_out, mapping, len(layer_types))
            report["draft_target_layer_ids"] = drafter["dflash_config"]["target_layer_ids"]
    except (ConversionError, OSError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.check:
        from transformers import AutoTokenizer

        sys.path.insert(0, str(ROOT))
        from ddtree_ops.compare.prompts import BUILTIN_PROMPTS

        tok = AutoTokenizer.from_pretrained(str(args.out))
        texts = [
            tok.apply_chat_template([dict(m) for m in p.messages], add_generation_prompt=True, tokenize=False)
            for p in BUILTIN_PROMPTS
        ]
        prompts = [list(tok.encode(text, add_special_tokens=False)) for text in texts]
        report["max_abs_diff_float32"] = logit_check(args.source, args.out, mapping, prompts)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
