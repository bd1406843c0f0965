"""The shipped lab pair really speculates: on the built-in compare prompts at T=0, dflash
commits >= 3 tokens per verify step, ddtree (budget 15, topk 8) >= 1.15x dflash, and both emit
exactly ar's tokens. These figures do not depend on speed, so they are checked on the CPU."""

from __future__ import annotations

import pytest

from ddtree_engine.reference.engine import load_engine
from ddtree_engine.reference.models import LAB_DIR
from ddtree_engine.types import SamplingParams, SpeculativeConfig
from ddtree_ops.compare.prompts import BUILTIN_PROMPTS

MAX_NEW = 128


@pytest.fixture(scope="module")
def lab_runs():
    engine = load_engine("lab", "lab", SpeculativeConfig("ar"), device="cpu", dtype="float32")
    runs = {}
    for name, spec in (("ar", SpeculativeConfig("ar")), ("dflash", SpeculativeConfig("dflash")),
                       ("ddtree", SpeculativeConfig("ddtree", 15, 8))):
        if name != "ar" and engine.drafter is None:
            engine = load_engine("lab", "lab", spec, device="cpu", dtype="float32")
        engine.spec = spec
        runs[name] = [
            engine.generate(engine.chat_prompt_ids([dict(m) for m in p.messages]), SamplingParams(max_new_tokens=MAX_NEW))
            for p in BUILTIN_PROMPTS
        ]
    return runs


def tokens_per_step(results) -> float:
    return sum(sum(r.accepted_per_step) for r in results) / sum(r.verify_steps for r in results)


def test_lab_pair_is_small_enough_to_ship():
    size = sum(f.stat().st_size for f in LAB_DIR.rglob("*") if f.is_file())
    assert size <= 16 * 2**20, f"lab pair is {size / 2**20:.1f} MiB"


def test_lab_pair_outputs_equal_ar(lab_runs):
    for name in ("dflash", "ddtree"):
        for prompt, res, ref in zip(BUILTIN_PROMPTS, lab_runs[name], lab_runs["ar"]):
            assert res.token_ids == ref.token_ids, f"{name} on {prompt.name}"


def test_lab_pair_acceptance(lab_runs):
    dflash = tokens_per_step(lab_runs["dflash"])
    ddtree = tokens_per_step(lab_runs["ddtree"])
    assert dflash >= 3.0, f"dflash commits {dflash:.2f} tokens/step"
    assert ddtree >= 1.15 * dflash, f"ddtree {ddtree:.2f} vs dflash {dflash:.2f} tokens/step"
