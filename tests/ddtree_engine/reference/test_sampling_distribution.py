"""At T > 0, ddtree samples from the target's own distribution: the joint histogram of the
first three generated tokens over many seeds (the third comes from a depth-1 tree node whenever
the depth-1 draft is accepted) matches the exact distribution computed from the
target's logits (chi-square, p > 0.001; seeds are fixed so the outcome is deterministic), and
the same statistic rejects the distribution at a different temperature (so it has power)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from engine_oracle import OracleDrafter, rule_siblings, run
from scipy.stats import chisquare

from ddtree_engine.core.hybrid import flattened_parents
from ddtree_engine.types import SpeculativeConfig

PROMPT = [60, 9, 200, 33, 101]
RUNS = 300
TEMPERATURE = 0.03  # the tiny random models have flat logits; this makes a few tokens likely


def _next_probs(runner, ids, temperature):
    cache = runner.new_cache()
    n = len(ids)
    out = runner.forward(cache, torch.tensor(ids), flattened_parents(n), torch.arange(n), linear=True)
    return torch.softmax(out.logits[-1].double() / temperature, dim=-1)


def exact_triple_distribution(runner, prompt, temperature, top=6):
    """P(t1, t2, t3) over the `top` most likely t1 and t2 (the rest of the mass is 'other')."""
    p1 = _next_probs(runner, prompt, temperature)
    dist = {}
    for t1 in torch.argsort(p1, descending=True)[:top].tolist():
        p2 = _next_probs(runner, prompt + [t1], temperature)
        for t2 in torch.argsort(p2, descending=True)[:top].tolist():
            p3 = _next_probs(runner, prompt + [t1, t2], temperature)
            for t3, p in enumerate(p3.tolist()):
                dist[(t1, t2, t3)] = p1[t1].item() * p2[t2].item() * p
    return dist


def chi_square_p(counts: Counter, dist: dict, runs: int) -> float:
    bins = sorted((p, pair) for pair, p in dist.items() if p * runs >= 5)
    observed = [counts.get(pair, 0) for _, pair in bins]
    expected = [p * runs for p, _ in bins]
    observed.append(runs - sum(observed))
    expected.append(runs - sum(expected))
    return chisquare(observed, expected).pvalue


@pytest.fixture(scope="module")
def ddtree_triples(engines):
    engine = engines["qwen3-next"]
    greedy = run(engine, PROMPT, SpeculativeConfig("ar"), 16).token_ids
    counts: Counter = Counter()
    accepted = 0
    for seed in range(RUNS):
        drafter = OracleDrafter(PROMPT + greedy, engine.runner.vocab_size, rule_siblings, seed=seed)
        result = run(engine, PROMPT, SpeculativeConfig("ddtree", 15, 8), 3, drafter=drafter,
                     temperature=TEMPERATURE, seed=seed)
        counts[tuple(result.token_ids[:3])] += 1
        accepted += sum(s.accepted_drafts for s in result.steps)
    return counts, accepted


def test_ddtree_matches_the_target_distribution(engines, ddtree_triples):
    counts, accepted = ddtree_triples
    assert accepted > RUNS // 4, "the second token should often come from an accepted draft"
    dist = exact_triple_distribution(engines["qwen3-next"].runner, PROMPT, TEMPERATURE)
    assert chi_square_p(counts, dist, RUNS) > 1e-3


def test_the_statistic_rejects_a_different_distribution(engines, ddtree_triples):
    counts, _ = ddtree_triples
    wrong = exact_triple_distribution(engines["qwen3-next"].runner, PROMPT, TEMPERATURE * 1.6)
    assert chi_square_p(counts, wrong, RUNS) < 1e-3
