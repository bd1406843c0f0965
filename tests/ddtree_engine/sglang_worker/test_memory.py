"""The verify-state memory DDTREE needs beyond DFLASH (sglang_plugin/memory.py), by hand on real configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddtree_engine.sglang_plugin.memory import GdnShape, describe, extra_over_dflash, verify_state_bytes

REPO = Path(__file__).resolve().parents[3]
Q35_4B = json.loads((REPO / "benchmarks/sglang_h200/configs/q35-4b/target/config.json").read_text())
LAB = json.loads((REPO / "engine_patches/ddtree_engine/src/ddtree_engine/lab_models/target/config.json").read_text())


def test_shape_of_the_4b_hybrid():
    shape = GdnShape.from_hf_config(Q35_4B)
    # 24 GDN layers of 32 value heads x 128 x 128; conv over q, k (16 heads x 128 each) and v.
    assert shape == GdnShape(layers=24, value_heads=32, key_dim=128, value_dim=128, conv_dim=8192, conv_kernel=4)


def test_4b_hybrid_by_hand():
    shape = GdnShape.from_hf_config(Q35_4B)
    per_row_ssm = 24 * 32 * 128 * 128 * 4  # fp32 recurrent state, every GDN layer
    dflash = verify_state_bytes(shape, 16, dense_conv=False)
    assert dflash == {"ssm": 16 * per_row_ssm, "conv": 24 * 8192 * 18 * 2, "total": 16 * per_row_ssm + 24 * 8192 * 18 * 2}
    # Budget 15 verifies DFLASH's 16 rows: only the dense conv layout of a tree costs more (11.25 MiB).
    same_width = extra_over_dflash(shape, 16, 16, 8)
    assert same_width["extra"] == 24 * 8192 * (48 - 18) * 2 == 11_796_480
    # Budget 31: 16 more rows of fp32 state per request slot, 768 MiB of it.
    wide = extra_over_dflash(shape, 32, 16, 8)
    assert wide["extra"] == 16 * per_row_ssm + 24 * 8192 * (96 - 18) * 2 == 835_977_216
    # topk 1 is a chain: SGLang keeps the deduplicated layout, nothing extra at DFLASH's width.
    assert extra_over_dflash(shape, 16, 16, 1)["extra"] == 0


def test_lab_pair_and_attention_only_targets():
    lab = GdnShape.from_hf_config(LAB)
    assert lab.layers == 6 and lab.conv_dim == 2 * 2 * 64 + 4 * 64
    assert GdnShape.from_hf_config({"model_type": "qwen3", "num_hidden_layers": 4}) is None


@pytest.mark.parametrize("width,topk", [(16, 8), (32, 8), (9, 1)])
def test_the_log_line_adds_up(width, topk):
    shape = GdnShape.from_hf_config(Q35_4B)
    line = describe(shape, width, 16, topk, slots=49)
    per = extra_over_dflash(shape, width, 16, topk)
    assert f"+{per['extra'] * 49 / (1 << 30):.2f} GiB for DDTREE" in line
    assert f"{max(width, 16)} rows per request, 49 request slots" in line
