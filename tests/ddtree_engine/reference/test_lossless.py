"""Losslessness: at T=0, dflash and ddtree emit exactly the tokens ar emits, on an
attention-only (Qwen3) and a hybrid (Qwen3-Next) target, with drafters that force long and
sibling acceptances — the cases that break a wrong KV compaction or hybrid state commit."""

from __future__ import annotations

import itertools

import pytest
from engine_oracle import ARCHES, OracleDrafter, make_rule_noisy, rule_deep, rule_siblings, run

from ddtree_engine.types import SpeculativeConfig

BUDGETS = (1, 4, 8, 15, 16, 32, 64)
TOPKS = (1, 2, 8)
PROMPTS = {
    "len1": [72],
    "len5": [60, 9, 200, 33, 101],
    "len23": [(i * 37 + 11) % 256 for i in range(23)],
}
MAX_NEW = 40


@pytest.fixture(scope="module")
def references(engines):
    """ar output per (arch, prompt): the ground truth every other run must reproduce."""
    return {
        (arch, name): run(engines[arch], prompt, SpeculativeConfig("ar"), MAX_NEW).token_ids
        for arch in ARCHES
        for name, prompt in PROMPTS.items()
    }


def _oracle(engine, prompt, reference, rule, seed=0, spacing=0.7):
    return OracleDrafter(prompt + reference, engine.runner.vocab_size, rule, seed=seed, spacing=spacing)


RULES = {"deep": lambda seed: rule_deep, "siblings": lambda seed: rule_siblings, "noisy": make_rule_noisy}


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("budget,topk", list(itertools.product(BUDGETS, TOPKS)))
def test_ddtree_matches_ar_at_t0(engines, references, arch, budget, topk):
    engine = engines[arch]
    spec = SpeculativeConfig("ddtree", budget=budget, topk=topk)
    for (name, prompt), rule_name in zip(PROMPTS.items(), RULES):
        reference = references[(arch, name)]
        for drafter in (_oracle(engine, prompt, reference, RULES[rule_name](budget * 10 + topk)), None):
            result = run(engine, prompt, spec, MAX_NEW, drafter=drafter)
            which = rule_name if drafter is not None else "dflash-random"
            assert result.token_ids == reference, f"{arch} budget={budget} topk={topk} prompt={name} drafter={which}"


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("rule_name", list(RULES))
def test_dflash_matches_ar_at_t0(engines, references, arch, rule_name):
    engine = engines[arch]
    for name, prompt in PROMPTS.items():
        reference = references[(arch, name)]
        drafter = _oracle(engine, prompt, reference, RULES[rule_name](7))
        result = run(engine, prompt, SpeculativeConfig("dflash"), MAX_NEW, drafter=drafter)
        assert result.token_ids == reference, f"{arch} prompt={name} drafter={rule_name}"
    result = run(engine, PROMPTS["len5"], SpeculativeConfig("dflash"), MAX_NEW)
    assert result.token_ids == references[(arch, "len5")]


@pytest.mark.parametrize("arch", ARCHES)
def test_oracle_drafts_are_really_accepted(engines, references, arch):
    """The cases above must exercise what they claim: full-depth blocks and non-first siblings at depth >= 2."""
    engine = engines[arch]
    prompt = PROMPTS["len5"]
    reference = references[(arch, "len5")]
    for spec in (SpeculativeConfig("dflash"), SpeculativeConfig("ddtree", 15, 8)):
        drafter = _oracle(engine, prompt, reference, rule_deep, spacing=6.0)
        deep = run(engine, prompt, spec, MAX_NEW, drafter=drafter)
        assert deep.token_ids == reference
        assert deep.steps[0].accepted_drafts == 15, spec  # the whole block
        assert deep.accepted_per_step[:2] == [16, 16], spec

    seen_sibling_deep = False
    for budget, topk in ((15, 8), (32, 2), (64, 8)):
        drafter = _oracle(engine, prompt, reference, rule_siblings)
        result = run(engine, prompt, SpeculativeConfig("ddtree", budget, topk), MAX_NEW, drafter=drafter)
        assert result.token_ids == reference
        # rule_siblings puts the truth at rank 1 at depth 2 on step 0: accepted only through a sibling.
        seen_sibling_deep |= result.steps[0].accepted_drafts >= 2
    assert seen_sibling_deep


@pytest.mark.parametrize("mode", ["safe", "spine"])
def test_hybrid_modes_are_lossless(engines, references, mode):
    engine = engines["qwen3-next"]
    for name, prompt in PROMPTS.items():
        reference = references[("qwen3-next", name)]
        drafter = _oracle(engine, prompt, reference, rule_siblings)
        result = run(engine, prompt, SpeculativeConfig("ddtree", 15, 8, hybrid_mode=mode), MAX_NEW, drafter=drafter)
        assert result.token_ids == reference, f"mode={mode} prompt={name}"
