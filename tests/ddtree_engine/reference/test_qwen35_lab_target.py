"""The lab target as dense Qwen3.5 (`qwen3_5_text`), the hybrid SGLang 0.5.23 loads without MoE.

- training/convert_lab_pair_qwen35.py turns a dense Qwen3-Next target into Qwen3.5 with the
  same logits and the same drafter features: held here on a random hybrid with the lab
  target's layer pattern (slow decay and non-trivial norms, so a misplaced row shows), in
  float64 and float32 (measured max |Δ| 0 in both).
- The shipped target is that conversion: a pattern SGLang builds from `full_attention_interval`
  alone (configs/qwen3_next.py `layers_block_type`: layer i is attention iff
  (i + 1) % interval == 0; it ignores `layer_types`), checkpoint names SGLang's qwen3_5 loader
  reads (models/qwen3_5.py `load_weights`: in_proj_qkv/z/b/a, no packed in_proj_qkvz), a strict
  Hugging Face load, identity layers only where the conversion put them, and a drafter that
  reads live layers.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from repo_scripts import load_script

from ddtree_engine.reference.models import LAB_DIR
from ddtree_engine.reference.tiny import interval_layer_types, set_gdn_decay, target_config

ROOT = Path(__file__).resolve().parents[3]
L, F = "linear_attention", "full_attention"
LAB_SOURCE_TYPES = [L, L, L, F, L, F]  # the Qwen3-Next lab target training/train_lab_pair.py builds
PROMPTS = ([60, 9, 200, 33, 101], [(i * 37 + 11) % 256 for i in range(23)])
# Measured 0 (float64 and float32): rows only move and identity layers add exact zeros. A
# misplaced row moves the logits by ~1e-2 (see the mutation notes in the converter's report).
EXACT = 1e-7
# Per-layer checkpoint names SGLang 0.5.23's Qwen3.5 loader maps (read in its load_weights and
# module definitions), after it strips `model.`; attention names lose `.self_attn` there.
SGLANG_LAYER_NAMES = {
    "input_layernorm.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight", "linear_attn.in_proj_b.weight",
    "linear_attn.in_proj_a.weight", "linear_attn.conv1d.weight", "linear_attn.A_log", "linear_attn.dt_bias",
    "linear_attn.norm.weight", "linear_attn.out_proj.weight",
}


def _converter():
    # training/ is a folder of scripts, not a package: load the converter by path.
    return load_script("training/convert_lab_pair_qwen35.py", "convert_lab_pair_qwen35")


CONVERT = _converter()


def test_layer_plan_keeps_every_layer_in_order_in_sglangs_pattern():
    types, mapping = CONVERT.layer_plan(LAB_SOURCE_TYPES, 4)
    assert types == [L, L, L, F, L, L, L, F] and mapping == [0, 1, 2, 3, 4, 7]
    assert CONVERT.layer_plan(LAB_SOURCE_TYPES, 2) == ([L, F] * 4, [0, 2, 4, 5, 6, 7])
    rng = random.Random(0)
    for _ in range(200):
        source = [rng.choice((L, F)) for _ in range(rng.randint(1, 12))]
        interval = rng.randint(2, 6)
        types, mapping = CONVERT.layer_plan(source, interval)
        assert types == interval_layer_types(len(types), interval)
        assert [types[m] for m in mapping] == source
        assert mapping == sorted(set(mapping)) and mapping[-1] == len(types) - 1
    with pytest.raises(CONVERT.ConversionError, match="sliding_attention"):
        CONVERT.layer_plan([L, "sliding_attention"], 4)


@pytest.fixture(scope="module")
def random_conversion(tmp_path_factory):
    """(source dir, converted dir, mapping) for a random Qwen3-Next with the lab's pattern."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("qwen35-convert")
    torch.manual_seed(0)
    config = target_config("qwen3-next", vocab_size=260, hidden_size=64, num_layers=6)
    assert config.layer_types == LAB_SOURCE_TYPES
    model = AutoModelForCausalLM.from_config(config)
    set_gdn_decay(model)  # the recurrent state shapes the output, so a wrong state row shows
    with torch.no_grad():  # norms away from their identity, so a swapped norm shows too
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(str(root / "source"))
    mapping = CONVERT.convert(root / "source", root / "out")
    return root / "source", root / "out", mapping


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_conversion_keeps_logits_and_drafter_features(random_conversion, dtype):
    source, out, mapping = random_conversion
    assert mapping == [0, 1, 2, 3, 4, 7]
    worst = CONVERT.logit_check(source, out, mapping, list(PROMPTS), dtype=dtype)
    assert worst["logits"] <= EXACT, f"logits: max |Δ| {worst['logits']:.2e} (scale {worst['logit_scale']:.2f})"
    assert worst["features"] <= EXACT, f"features: max |Δ| {worst['features']:.2e}"


def test_converted_checkpoint_is_a_strict_qwen35_load_with_identity_layers_where_planned(random_conversion):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    _, out, mapping = random_conversion
    model, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    state = load_file(str(out / "model.safetensors"))
    inserted = sorted(set(range(model.config.num_hidden_layers)) - set(mapping))
    assert inserted == [5, 6]
    for slot in range(model.config.num_hidden_layers):
        writes = [f"model.layers.{slot}.mlp.down_proj.weight"] + [
            f"model.layers.{slot}.{n}" for n in ("linear_attn.out_proj.weight", "self_attn.o_proj.weight")
            if f"model.layers.{slot}.{n}" in state
        ]
        silent = all(not state[w].any() for w in writes)
        assert silent == (slot in inserted), f"layer {slot}: output projections zero = {silent}"


def test_remapped_drafter_points_at_the_same_layers(random_conversion, tmp_path):
    _, out, mapping = random_conversion
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "weights.bin").write_bytes(b"\x01\x02")
    config = {"dflash_config": {"target_layer_ids": [1, 5]}, "num_target_layers": 6}
    (draft / "config.json").write_text(json.dumps(config))
    config = CONVERT.remap_drafter(draft, tmp_path / "draft-out", mapping, 8)
    assert config["dflash_config"]["target_layer_ids"] == [1, 7] and config["num_target_layers"] == 8
    assert (tmp_path / "draft-out" / "weights.bin").read_bytes() == b"\x01\x02"


def test_converter_refuses_a_moe_source_with_exit_2(tmp_path, capsys):
    source = tmp_path / "moe"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(
        {"model_type": "qwen3_next", "num_experts": 8, "mlp_only_layers": [], "num_hidden_layers": 2,
         "layer_types": [L, F]}
    ))
    assert CONVERT.main(["--source", str(source), "--out", str(tmp_path / "out")]) == 2
    assert "MoE experts have no dense Qwen3.5 equivalent" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# --- the shipped lab target -----------------------------------------------------------------

def test_shipped_lab_target_is_qwen35_in_a_pattern_sglang_builds():
    config = json.loads((LAB_DIR / "target" / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_text" and config["architectures"] == ["Qwen3_5ForCausalLM"]
    assert config.get("num_experts") in (None, 0)
    interval = config["full_attention_interval"]
    assert config["layer_types"] == interval_layer_types(config["num_hidden_layers"], interval)


def test_shipped_lab_target_loads_strictly_with_names_sglang_reads():
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(str(LAB_DIR / "target"), output_loading_info=True)
    assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    with safe_open(str(LAB_DIR / "target" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    per_layer = {n.split(".", 3)[3] for n in names if n.startswith("model.layers.")}
    assert per_layer <= SGLANG_LAYER_NAMES, sorted(per_layer - SGLANG_LAYER_NAMES)
    assert names - {n for n in names if n.startswith("model.layers.")} == {
        "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"
    }


def test_lab_drafter_reads_live_layers_of_the_shipped_target():
    from safetensors.torch import load_file

    target = json.loads((LAB_DIR / "target" / "config.json").read_text())
    draft = json.loads((LAB_DIR / "draft" / "config.json").read_text())
    assert draft["num_target_layers"] == target["num_hidden_layers"]
    state = load_file(str(LAB_DIR / "target" / "model.safetensors"))
    for i in draft["dflash_config"]["target_layer_ids"]:
        assert state[f"model.layers.{i}.mlp.down_proj.weight"].any(), f"drafter reads identity layer {i}"


def test_sglang_resolves_the_shipped_config_to_its_qwen35_layers():
    """Runs where SGLang's config package imports (the contract environment); skipped elsewhere."""
    try:
        from sglang.srt.utils.hf_transformers.config import get_config
    except ImportError as err:
        pytest.skip(f"sglang config package not importable here: {err}")
    config = get_config(str(LAB_DIR / "target"), trust_remote_code=False)
    ours = json.loads((LAB_DIR / "target" / "config.json").read_text())
    assert type(config).__name__ == "Qwen3_5TextConfig"
    assert config.layers_block_type == ["attention" if t == F else t for t in ours["layer_types"]]
