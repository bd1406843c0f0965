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


def _held_bytes(*objects) -> int:
    """Bytes of the distinct tensor storages the objects hold (attributes, tuples and lists of them)."""
    import torch

    seen, total = set(), 0
    for obj in objects:
        for value in vars(obj).values():
            items = value if isinstance(value, (tuple, list)) else (value,)
            for item in items:
                if isinstance(item, torch.Tensor) and item.untyped_storage().data_ptr() not in seen:
                    seen.add(item.untyped_storage().data_ptr())
                    total += item.untyped_storage().nbytes()
    return total


@pytest.mark.parametrize("budget,topk,rows", [(15, 8, 16), (8, 4, 16), (31, 8, 32), (1, 1, 16)])
def test_tree_step_bytes_are_what_the_buffers_hold(budget, topk, rows):
    """The startup line's per-request figure equals the storages TreeStep, TreePrep (one request, its
    rows of the logits and hidden-state buffers) and WalkCommit allocate, on small real objects."""
    pytest.importorskip("triton")
    import torch

    from ddtree_engine.kernels.tree_step import TreeStep
    from ddtree_engine.sglang_plugin.memory import tree_step_bytes
    from ddtree_engine.sglang_plugin.prep import TreePrep
    from ddtree_engine.sglang_plugin.walk_commit import WalkCommit

    depths, vocab, padded, hidden = 6, 50, 64, 12
    weight = torch.zeros(padded, hidden, dtype=torch.bfloat16)
    step = TreeStep(depths, vocab, budget, topk, "cpu")
    logits = torch.empty(1, depths, padded, dtype=torch.bfloat16)
    prep = TreePrep([step], weight, vocab, rows, logits, torch.zeros(1, depths, hidden, dtype=torch.bfloat16))
    post = WalkCommit([step], rows, torch.zeros(2, 8, dtype=torch.int32), torch.int64)
    held = _held_bytes(step, prep, post) - weight.untyped_storage().nbytes()
    held -= post.req_to_token.untyped_storage().nbytes()  # SGLang's table, not the tree step's
    want = tree_step_bytes(depths, padded, hidden, budget, topk, rows, head_bytes=2)
    assert held == want["total"]
    assert want["draft_logits"] == depths * padded * 2


def test_tree_step_line_at_real_sizes():
    from ddtree_engine.sglang_plugin.memory import describe_tree_step, tree_step_bytes

    per = tree_step_bytes(15, 151_936, 2560, 15, 8, 16)
    assert per["draft_logits"] == 15 * 151_936 * 2  # 4.35 MiB
    assert per["draft_logits"] < per["total"] < per["draft_logits"] + 128 * 1024
    line = describe_tree_step(15, 151_936, 2560, 15, 8, 16)
    assert "4.4" in line and "[15, 151936]" in line and "one memory pool" in line
