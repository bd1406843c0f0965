"""The generation loop runs the named steps (prefill, then draft -> build -> verify -> walk ->
commit per verify step), and replacing one step changes exactly what that step decides while
the output stays the target's (T=0, equal to `ar`)."""

from __future__ import annotations

import dataclasses

import pytest
from engine_oracle import OracleDrafter, rule_siblings

from ddtree_engine.core.sampling import choose_tokens
from ddtree_engine.core.tree import compile_tree, spine_of
from ddtree_engine.core.walk import WalkResult
from ddtree_engine.reference.steps import REFERENCE_STEPS, DecodeSteps
from ddtree_engine.types import SamplingParams, SpeculativeConfig

PROMPT = [60, 9, 200, 33, 101]
MAX_NEW = 24
STEP_NAMES = [f.name for f in dataclasses.fields(DecodeSteps)]


@pytest.fixture(scope="module")
def hybrid(engines):
    """The hybrid engine with an oracle drafter (sibling acceptances), and the ar reference."""
    engine = engines["qwen3-next"]
    ar = dataclasses.replace(engine, spec=SpeculativeConfig("ar"))
    reference = ar.generate(PROMPT, SamplingParams(max_new_tokens=MAX_NEW)).token_ids

    def with_steps(steps: DecodeSteps, budget: int = 32, topk: int = 8):
        drafter = OracleDrafter(PROMPT + reference, engine.runner.vocab_size, rule_siblings)
        spec = SpeculativeConfig("ddtree", budget, topk)
        return dataclasses.replace(engine, spec=spec, drafter=drafter, steps=steps)

    return with_steps, reference


def test_each_verify_step_runs_draft_build_verify_walk_commit_in_order(hybrid):
    with_steps, reference = hybrid
    calls: list[str] = []

    def recorded(name):
        inner = getattr(REFERENCE_STEPS, name)

        def step(*args):
            calls.append(name)
            return inner(*args)

        return step

    steps = DecodeSteps(**{name: recorded(name) for name in STEP_NAMES})
    result = with_steps(steps).generate(PROMPT, SamplingParams(max_new_tokens=MAX_NEW))
    assert result.token_ids == reference
    assert calls == ["prefill"] + ["draft", "build", "verify", "walk", "commit"] * result.verify_steps


def test_a_replaced_build_step_is_what_gets_verified(hybrid):
    with_steps, reference = hybrid

    def spine_only(state, draft_logits, root):
        full = REFERENCE_STEPS.build(state, draft_logits, root)
        return compile_tree(spine_of(full.tree), state.cache.length)

    tree = with_steps(REFERENCE_STEPS).generate(PROMPT, SamplingParams(max_new_tokens=MAX_NEW))
    spine = with_steps(dataclasses.replace(REFERENCE_STEPS, build=spine_only)).generate(
        PROMPT, SamplingParams(max_new_tokens=MAX_NEW)
    )
    assert tree.token_ids == spine.token_ids == reference
    assert max(s.tree_nodes for s in tree.steps) == 32  # the full budget is verified...
    assert max(s.tree_nodes for s in spine.steps) <= 15  # ...the spine is at most block_size - 1 deep
    assert sum(s.accepted_drafts for s in spine.steps) < sum(s.accepted_drafts for s in tree.steps)


def test_a_replaced_walk_step_decides_what_is_accepted(hybrid):
    with_steps, reference = hybrid

    def accept_nothing(state, compiled, verified):
        choices = choose_tokens(verified.logits, state.params.temperature, state.generator)
        return WalkResult(path=[0], accepted_tokens=[], bonus_token=int(choices[0]))

    result = with_steps(dataclasses.replace(REFERENCE_STEPS, walk=accept_nothing)).generate(
        PROMPT, SamplingParams(max_new_tokens=MAX_NEW)
    )
    assert result.token_ids == reference  # one target token per step is still the target's output
    assert [s.accepted_drafts for s in result.steps] == [0] * (MAX_NEW - 1)
