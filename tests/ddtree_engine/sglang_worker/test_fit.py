"""A DDTREE budget whose hybrid verify states do not fit: DDTREE's message (sglang_plugin/fit.py, memory.py).

SGLang's own shortfall error advises reducing --speculative-num-draft-tokens, which DDTREE sets from
its budget. The wrapper the plugin installs turns that error, and only that one, into DDTREE's numbers.
The wrapper's SGLang side (the method it wraps and the message it matches) is checked against the
installed sglang in tests/ddtree_engine/sglang_plugin/test_worker_contract.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddtree_engine.sglang_plugin.fit import LEFT_NOTHING, SHORTFALL, drafter_block, explain_mamba_shortfall
from ddtree_engine.sglang_plugin.memory import GdnShape, shortfall_message

REPO = Path(__file__).resolve().parents[3]
Q35_4B = json.loads((REPO / "benchmarks/sglang_h200/configs/q35-4b/target/config.json").read_text())
SGLANG_ERROR = (
    "Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed max_mamba_cache_size=0 "
    "(total_rest_memory=1.20 GB, mamba_cache_per_req=1650.00 MB). Try: (1) reduce --max-running-requests, ..."
)


def test_the_message_gives_ddtrees_per_request_figure_and_the_flags_to_change():
    shape = GdnShape.from_hf_config(Q35_4B)
    text = shortfall_message(shape, budget=31, topk=8, width=32, block=16, slots=3, sglang_message=SGLANG_ERROR)
    # 4B by hand (test_memory.py): DFLASH's 16 rows 774.8 MiB, +797.2 MiB at budget 31 -> 1572.0 MiB per slot.
    assert "verifies 32 rows per request" in text
    assert "1572.0 MiB per request slot" in text and "DFLASH at block 16 needs 774.8" in text
    assert "4.61 GiB for 3 slots" in text
    assert "(budget 15: 786.0 MiB per request)" in text
    for flag in ("--speculative-ddtree-budget", "--max-running-requests", "--mem-fraction-static"):
        assert flag in text
    assert text.endswith("SGLang said: " + SGLANG_ERROR)
    # At budget 15 or below there is no smaller budget to name.
    assert "(budget 15" not in shortfall_message(shape, budget=15, topk=8, width=16, block=16, slots=2, sglang_message="x")


class Boom:
    def __init__(self, exc):
        self.exc = exc

    def __call__(self, configurator, *args, **kwargs):
        if self.exc is not None:
            raise self.exc
        return ("sized", args, kwargs)


def test_the_wrapper_turns_only_sglangs_shortfall_into_ddtrees_message():
    mine = lambda configurator, message: f"DDTREE says: {message[:30]}"  # noqa: E731
    # Success passes through, arguments and all.
    assert explain_mamba_shortfall(Boom(None), object(), 7, message_for=mine, k=1) == ("sized", (7,), {"k": 1})
    # The shortfall becomes DDTREE's message, chained to SGLang's.
    with pytest.raises(RuntimeError, match="^DDTREE says: Not enough GPU memory") as info:
        explain_mamba_shortfall(Boom(RuntimeError(SGLANG_ERROR)), object(), message_for=mine)
    assert SHORTFALL in str(info.value.__cause__)
    # Another error, or a server that is not DDTREE on a hybrid (message None), is SGLang's own.
    with pytest.raises(RuntimeError, match="^CUDA out of memory"):
        explain_mamba_shortfall(Boom(RuntimeError("CUDA out of memory")), object(), message_for=mine)
    with pytest.raises(RuntimeError, match="^Not enough GPU memory for hybrid"):
        explain_mamba_shortfall(Boom(RuntimeError(SGLANG_ERROR)), object(), message_for=lambda c, m: None)
    with pytest.raises(ValueError):
        explain_mamba_shortfall(Boom(ValueError(SGLANG_ERROR)), object(), message_for=mine)


class Sized:
    """SGLang's pool sizing on its --max-running-requests path: returns what is left (GB), raises nothing."""

    def __init__(self, used):
        self.used = used

    def __call__(self, configurator, total_rest_memory):
        return total_rest_memory - self.used


def test_a_pool_that_leaves_nothing_for_the_kv_cache_gets_ddtrees_message_not_the_weights_blamed():
    mine = lambda configurator, message: f"DDTREE says: {message}"  # noqa: E731
    verify = lambda gb: (lambda configurator: gb)  # noqa: E731
    # The verify states took a positive rest below zero: DDTREE's message, with the figures, not SGLang's
    # "weights" sentence (which its caller would print, and harnesses read as a memory race).
    with pytest.raises(RuntimeError, match="^DDTREE says: its pool sizing left -10.90 GB") as info:
        explain_mamba_shortfall(Sized(12.8), object(), 1.9, message_for=mine, verify_gb_for=verify(12.0))
    assert "the hybrid states take 12.80 GB, 12.00 GB of it the per-row verify states" in str(info.value)
    assert LEFT_NOTHING not in str(info.value)
    with pytest.raises(RuntimeError, match="^DDTREE says"):  # exactly nothing left
        explain_mamba_shortfall(Sized(1.9), object(), total_rest_memory=1.9, message_for=mine, verify_gb_for=verify(1.0))
    # The persistent states alone (or the weights) leave nothing: a smaller budget would not help, SGLang reports it.
    assert explain_mamba_shortfall(Sized(2.5), object(), 1.9, message_for=mine, verify_gb_for=verify(0.5)) == pytest.approx(-0.6)
    assert explain_mamba_shortfall(Sized(2.5), object(), 1.9, message_for=mine, verify_gb_for=verify(0.0)) == pytest.approx(-0.6)
    # What fits passes through; a rest already gone before the states is SGLang's (the weights) to report;
    # a server that is not DDTREE on a hybrid keeps SGLang's path.
    assert explain_mamba_shortfall(Sized(1.0), object(), 1.9, message_for=mine, verify_gb_for=verify(0.5)) == pytest.approx(0.9)
    assert explain_mamba_shortfall(Sized(1.0), object(), -0.5, message_for=mine, verify_gb_for=verify(0.5)) == pytest.approx(-1.5)
    assert explain_mamba_shortfall(Sized(12.8), object(), 1.9, message_for=lambda c, m: None,
                                   verify_gb_for=verify(12.0)) == pytest.approx(-10.9)


def test_the_drafters_block_comes_from_its_config(tmp_path):
    lab_draft = REPO / "engine_patches/ddtree_engine/src/ddtree_engine/lab_models/draft"
    assert drafter_block(lab_draft) == 16
    (tmp_path / "config.json").write_text(json.dumps({"dflash_config": {"block_size": 8}}))
    assert drafter_block(tmp_path) == 8
    assert drafter_block(tmp_path / "missing") == 16 and drafter_block(None) == 16
