"""Losslessness: at T=0, dflash and ddtree emit exactly the tokens ar emits, on an
attention-only (Qwen3) and a hybrid (Qwen3-Next, slow GDN decay) target, in both exact hybrid
modes, over the full product budget x topk x drafter rule x prompt length; and on dense Qwen3.5
(the same hybrid with split Gated-DeltaNet projections, the layout SGLang loads) over a subset:
its tree and state code is Qwen3-Next's, only the projections differ.

Every case also checks that
- each verify step accepted the depth the tree's best-first rule allows for that drafter
  (engine_oracle.tree_depth_bounds, exact unless the budget splits a group of equally likely
  prefixes): the `deep` drafter reaches full depth whenever the budget holds a full chain, the
  `siblings` drafter gets its non-first children accepted wherever the tree holds them;
- the target's final cache equals a plain prefill of the committed tokens (KV of every
  attention layer, conv window and recurrent state of every Gated-DeltaNet layer).
"""

from __future__ import annotations

import itertools

import pytest
from engine_oracle import (
    ARCHES,
    OracleDrafter,
    accepted_non_first,
    ar_tokens,
    checked_run,
    draft_steps,
    expected_depths,
    make_rule_noisy,
    rule_deep,
    rule_siblings,
    step_depth_bounds,
)

from ddtree_engine.core.tree import build_tree, spine_of
from ddtree_engine.types import SpeculativeConfig

BUDGETS = (1, 4, 8, 15, 16, 32, 64)
TOPKS = (1, 2, 8)
PROMPTS = {
    "len1": [72],
    "len5": [60, 9, 200, 33, 101],
    "len23": [(i * 37 + 11) % 256 for i in range(23)],
}
MAX_NEW = 40
# (rule factory by seed, logit spacing between ranks). `deep` is confident (spacing 4: the
# whole rank-0 chain costs less than any rank-1 node, so best-first takes it first and it
# reaches full depth at every topk); the others let siblings compete (spacing 0.7).
RULES = {
    "deep": (lambda seed: rule_deep, 4.0),
    "siblings": (lambda seed: rule_siblings, 0.7),
    "noisy": (make_rule_noisy, 0.7),
}
# Hybrid modes that claim exactness; on an attention-only target the mode changes nothing.
TARGETS = (("qwen3", "safe"), ("qwen3-next", "safe"), ("qwen3-next", "spine"))
# Qwen3.5, safe: the budgets of the H200 acceptance runs, both prompt lengths past 1; spine: one tree.
QWEN35_SUBSET = [
    *itertools.product([("qwen3.5", "safe")], (1, 8, 15, 32), (1, 8), RULES, ("len5", "len23")),
    *itertools.product([("qwen3.5", "spine")], (15,), (8,), RULES, ("len5", "len23")),
]


def test_depth_model_agrees_with_build_tree():
    """The depth model the grid asserts with, held against core/tree.py on its own: for drafted
    blocks of every rule, spacing, budget and topk used here, the truth's depth in the built tree
    (or its spine) lies within the model's bounds, and the bounds are exact almost always."""
    vocab, steps, exact = 260, 0, 0
    reference = [(i * 53 + 7) % vocab for i in range(64)]
    for (make_rule, spacing), budget, topk, max_depth, spine in itertools.product(
        RULES.values(), BUDGETS, TOPKS, (15, 6, 2), (False, True)
    ):
        drafter = OracleDrafter(reference, vocab, make_rule(budget), spacing=spacing)
        for step in range(4):
            tree = build_tree(drafter.propose(reference[0], 0, max_depth), budget, topk, reference[0])
            if spine:
                tree = spine_of(tree)
            depth = _truth_depth(tree, reference[1:])
            bounds = step_depth_bounds(drafter, SpeculativeConfig("ddtree", budget, topk, hybrid_mode="spine"
                                                                  if spine else "safe"), True, step, max_depth)
            assert bounds.low <= depth <= bounds.high, (spacing, budget, topk, max_depth, spine, step)
            steps += 1
            exact += bounds.low == bounds.high
    assert exact >= 0.9 * steps, f"bounds exact in only {exact} of {steps} blocks"


def _truth_depth(tree, truth: list[int]) -> int:
    """How far `truth` (the tokens after the root) runs down `tree` from its root."""
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    node, depth = 0, 0
    while depth < len(truth):
        child = next((i for i in range(len(tokens)) if parents[i] == node and tokens[i] == truth[depth]), None)
        if child is None:
            break
        node, depth = child, depth + 1
    return depth


@pytest.fixture(scope="module")
def references(engines):
    """ar output per (arch, prompt), no stop tokens: the ground truth every other run must reproduce."""
    return {
        (arch, name): ar_tokens(engines[arch].runner, prompt, MAX_NEW)
        for arch in ARCHES
        for name, prompt in PROMPTS.items()
    }


def _oracle(engine, prompt, reference, rule_name, seed=0):
    make_rule, spacing = RULES[rule_name]
    return OracleDrafter(prompt + reference, engine.runner.vocab_size, make_rule(seed), spacing=spacing)


GRID = list(itertools.product(TARGETS, BUDGETS, TOPKS, RULES, PROMPTS)) + QWEN35_SUBSET


@pytest.mark.parametrize(
    "target,budget,topk,rule_name,prompt_name",
    GRID,
    ids=[f"{a}-{m}-b{b}-k{k}-{r}-{p}" for (a, m), b, k, r, p in GRID],
)
def test_ddtree_matches_ar_at_t0(engines, references, target, budget, topk, rule_name, prompt_name):
    arch, mode = target
    engine = engines[arch]
    prompt, reference = PROMPTS[prompt_name], references[(arch, prompt_name)]
    spec = SpeculativeConfig("ddtree", budget=budget, topk=topk, hybrid_mode=mode)
    drafter = _oracle(engine, prompt, reference, rule_name, seed=budget * 10 + topk)
    check = checked_run(engine.runner, drafter, prompt, spec, reference, MAX_NEW)
    assert check.failures() == []

    accepted = [s.accepted_drafts for s in check.result.steps]
    draft_depths = [depth for _, depth in draft_steps(check.result, drafter.block_size, MAX_NEW)]
    non_first = accepted_non_first(check.result, drafter, MAX_NEW)
    chain_only = topk == 1 or budget == 1 or (mode == "spine" and engine.runner.is_hybrid)
    if rule_name == "deep":
        # The truth is always rank 0: every step takes the whole chain the budget holds.
        assert accepted == [min(depth, budget) for depth in draft_depths]
    if chain_only:
        assert non_first == [], "a chain holds no non-first child"
    elif rule_name == "siblings":
        # Guaranteed non-first acceptances: those within every step's guaranteed depth.
        bounds = expected_depths(check.result, drafter, spec, engine.runner.is_hybrid, MAX_NEW)
        steps = [step for step, _ in draft_steps(check.result, drafter.block_size, MAX_NEW)]
        guaranteed = [
            (step, d)
            for step, b in zip(steps, bounds)
            for d in range(1, b.low + 1)
            if (drafter.rank_rule(step, d) or 0) >= 1
        ]
        assert guaranteed, "the siblings drafter must force a non-first child in every branching tree"
        assert set(guaranteed) <= set(non_first)
        if budget >= 6:
            # At step 0 the truth ranks are 0, 1. Spacing 0.7 makes a rank cost 0.686 + 0.7 * rank:
            # four prefixes cost less than (0, 1) ((0), (0, 0), (1), (0, 0, 0)) and (1, 0) ties with
            # it, so from budget 6 on the tree surely holds it: a non-first child at depth 2.
            assert (0, 2) in non_first


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("rule_name", list(RULES))
@pytest.mark.parametrize("prompt_name", list(PROMPTS))
def test_dflash_matches_ar_at_t0(engines, references, arch, rule_name, prompt_name):
    engine = engines[arch]
    prompt, reference = PROMPTS[prompt_name], references[(arch, prompt_name)]
    drafter = _oracle(engine, prompt, reference, rule_name, seed=7)
    check = checked_run(engine.runner, drafter, prompt, SpeculativeConfig("dflash"), reference, MAX_NEW)
    assert check.failures() == []
    if rule_name == "deep":
        depths = [depth for _, depth in draft_steps(check.result, drafter.block_size, MAX_NEW)]
        assert [s.accepted_drafts for s in check.result.steps] == depths  # every block whole


REAL_DRAFTER = list(itertools.product(TARGETS, BUDGETS, TOPKS)) + [(("qwen3.5", "safe"), 15, 8)]


@pytest.mark.parametrize(
    "target,budget,topk", REAL_DRAFTER, ids=[f"{a}-{m}-b{b}-k{k}" for (a, m), b, k in REAL_DRAFTER]
)
def test_ddtree_with_the_real_drafter_matches_ar(engines, references, target, budget, topk):
    """The tiny random DFlash drafter (its own features and KV cache) rarely hits, but the
    trees it builds must be verified and committed just as exactly."""
    arch, mode = target
    engine = engines[arch]
    for name in ("len1", "len23"):
        spec = SpeculativeConfig("ddtree", budget=budget, topk=topk, hybrid_mode=mode)
        check = checked_run(engine.runner, engine.drafter, PROMPTS[name], spec, references[(arch, name)], MAX_NEW)
        assert check.failures() == [], name


@pytest.mark.parametrize("arch", ARCHES)
def test_ar_and_dflash_with_the_real_drafter_keep_the_cache(engines, references, arch):
    engine = engines[arch]
    for algorithm in ("ar", "dflash"):
        drafter = None if algorithm == "ar" else engine.drafter
        check = checked_run(
            engine.runner, drafter, PROMPTS["len5"], SpeculativeConfig(algorithm), references[(arch, "len5")], MAX_NEW
        )
        assert check.failures() == [], algorithm
