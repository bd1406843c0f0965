"""On the hybrid target, the `unsafe` mode (flattened order) diverges from ar in a constructed
case — so the losslessness test can catch state leakage — while `safe` does not."""

from __future__ import annotations

import warnings

import pytest
from engine_oracle import OracleDrafter, run

from ddtree_engine.errors import BadInputError
from ddtree_engine.types import validate_spec
from ddtree_engine.types import SpeculativeConfig

PROMPTS = ([60, 9, 200, 33, 101], [1, 2, 3], [(i * 37 + 11) % 256 for i in range(23)])


def rule_second_sibling(step: int, depth: int):
    # The truth is always rank 1: the accepted child sits after a wrong sibling in flattened order.
    return 1


def test_unsafe_leaks_and_safe_does_not(engines):
    engine = engines["qwen3-next"]
    diverged = 0
    for prompt in PROMPTS:
        reference = run(engine, prompt, SpeculativeConfig("ar"), 40).token_ids
        for mode in ("safe", "unsafe"):
            spec = SpeculativeConfig("ddtree", 15, 2, hybrid_mode=mode, allow_hybrid_unsafe=True)
            drafter = OracleDrafter(prompt + reference, engine.runner.vocab_size, rule_second_sibling)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                result = run(engine, prompt, spec, 40, drafter=drafter)
            if mode == "safe":
                assert result.token_ids == reference
                assert sum(s.accepted_drafts for s in result.steps) > 10  # the siblings really were accepted
            else:
                diverged += result.token_ids != reference
    # Measured: every prompt diverges (with the slow GDN decay and with Hugging Face's default).
    assert diverged == len(PROMPTS), f"unsafe mode diverged on {diverged} of {len(PROMPTS)} prompts"


def test_unsafe_is_harmless_on_attention_only_targets(engines):
    engine = engines["qwen3"]
    prompt = PROMPTS[0]
    reference = run(engine, prompt, SpeculativeConfig("ar"), 30).token_ids
    spec = SpeculativeConfig("ddtree", 15, 2, hybrid_mode="unsafe", allow_hybrid_unsafe=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = run(engine, prompt, spec, 30, drafter=OracleDrafter(prompt + reference, 260, rule_second_sibling))
    assert result.token_ids == reference


def test_unsafe_needs_the_allow_flag_and_warns():
    with pytest.raises(BadInputError, match="allow-hybrid-unsafe"):
        validate_spec(SpeculativeConfig("ddtree", hybrid_mode="unsafe"), drafter=object())
    with pytest.warns(RuntimeWarning, match="leak"):
        validate_spec(SpeculativeConfig("ddtree", hybrid_mode="unsafe", allow_hybrid_unsafe=True), drafter=object())


def test_on_tokens_returning_true_stops_generation(engines):
    engine = engines["qwen3-next"]
    from ddtree_engine.types import SamplingParams

    chunks = []

    def stop_after_three(ids):
        chunks.append(list(ids))
        return sum(map(len, chunks)) >= 3

    saved, engine.spec = engine.spec, SpeculativeConfig("ar")
    try:
        result = engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=20), on_tokens=stop_after_three)
    finally:
        engine.spec = saved
    assert len(result.token_ids) == 3 and result.finish_reason == "stop"
    assert [t for c in chunks for t in c] == result.token_ids
