"""Test support for the engine: an oracle drafter that makes long accepted paths (and sibling
acceptances) happen on demand, a model of what depth each verify step must then accept, the
cache invariant (a generation's cache equals a plain prefill of what it committed), and a
helper to run an engine with another spec or drafter."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from ddtree_engine.core.hybrid import flattened_parents
from ddtree_engine.reference.engine import ReferenceEngine
from ddtree_engine.reference.generate import generate
from ddtree_engine.reference.target import TargetCache, TargetRunner
from ddtree_engine.types import GenerationResult, SamplingParams, SpeculativeConfig

# Attention-only, and two hybrid layouts of the same layers: Qwen3-Next (grouped Gated-DeltaNet
# projections) and dense Qwen3.5 (split projections, the one SGLang loads without MoE).
ARCHES = ("qwen3", "qwen3-next", "qwen3.5")

RankRule = Callable[[int, int], "int | None"]


class OracleDrafter:
    """A drafter that knows the target's greedy continuation.

    At verify step s and depth d (1-based) it places the true next token at rank
    `rank_rule(s, d)` of its distribution (None: the true token is absent). The other
    ranks are filled with seeded random tokens; rank r gets logit -spacing * r at every depth
    (small spacing: siblings compete; large: a confident chain).
    """

    capture_layers: list[int] = []

    def __init__(
        self,
        reference: list[int],
        vocab_size: int,
        rank_rule: RankRule,
        block_size: int = 16,
        seed: int = 0,
        spacing: float = 0.7,
    ):
        self.reference = reference
        self.vocab_size = vocab_size
        self.rank_rule = rank_rule
        self.block_size = block_size
        self.rng = random.Random(seed)
        self.spacing = spacing
        self.step = 0

    def reset(self) -> None:
        self.step = 0

    def observe(self, token_ids, features, positions) -> None:
        pass

    def rank_logits(self) -> torch.Tensor:
        """[V] the logit of rank r (same at every depth), float32 as `propose` writes it."""
        return -self.spacing * torch.arange(self.vocab_size, dtype=torch.float32)

    def propose(self, root_token: int, root_position: int, num_positions: int) -> torch.Tensor:
        logits = torch.empty(num_positions, self.vocab_size, dtype=torch.float32)
        values = self.rank_logits()
        for d in range(num_positions):
            order = list(range(self.vocab_size))
            self.rng.shuffle(order)
            pos = root_position + 1 + d
            truth = self.reference[pos] if pos < len(self.reference) else None
            rank = self.rank_rule(self.step, d + 1)
            if truth is not None:
                order.remove(truth)
                if rank is not None:
                    order.insert(rank, truth)
                else:
                    order.append(truth)  # last place: never drafted
            logits[d, torch.tensor(order)] = values
        self.step += 1
        return logits


def rule_deep(step: int, depth: int) -> int | None:
    """Always the argmax: every block accepted as deep as the tree's rank-0 chain goes."""
    return 0


def rule_siblings(step: int, depth: int) -> int | None:
    """Non-first siblings accepted at depth >= 2 (rank 1 or 2), misses now and then."""
    pattern = [0, 1, 0, 2, 1, 0, 0, 1, None, 0, 0, 0, 1, 0, 0]
    return pattern[(depth - 1 + step) % len(pattern)]


def make_rule_noisy(seed: int) -> RankRule:
    """Random ranks 0-3 or a miss, a pure function of (seed, step, depth): the tree model below
    may ask in any order and sees what the drafter saw."""

    def rule(step: int, depth: int) -> int | None:
        return random.Random(f"{seed}:{step}:{depth}").choice([0, 0, 0, 1, 1, 2, 3, None])

    return rule


# --- what a verify step must accept -------------------------------------------------------

# Prefix costs closer than this count as tied: the engine adds the same float64 log-probs in
# another order (about 1e-15 apart), while distinct costs of the drafters used here differ by
# at least 0.01 (spacing 0.7: a prefix with rank sum a and depth d costs 0.7 a + 0.686 d, and
# two such sums differ by >= 0.0137 for depths <= 15; spacing 4: by >= 0.0185).
COST_TIE = 1e-6


@dataclass(frozen=True)
class DepthBounds:
    """The accepted depth of one verify step: guaranteed at least `low`, at most `high`
    (equal unless the budget cuts a group of equally likely prefixes)."""

    low: int
    high: int


def rank_costs(drafter: OracleDrafter, k: int) -> list[float]:
    """-log p of ranks 0..k-1 under the drafter's per-depth distribution (float64)."""
    logp = torch.log_softmax(drafter.rank_logits().double(), dim=-1)
    return [-float(x) for x in logp[:k]]


def _count_cheaper(costs: list[float], max_depth: int, limit: float, cap: int) -> int:
    """Rank sequences of length 1..max_depth (ranks < len(costs)) costing <= limit, counted
    up to `cap` (enough to compare with a budget; the full count can be astronomical)."""

    def count(left: float, depth_left: int, found: int) -> int:
        if depth_left == 0:
            return found
        for c in costs:  # ascending: once one rank is too dear, so are the rest
            if c > left or found >= cap:
                break
            found = count(left - c, depth_left - 1, found + 1)
        return found

    return count(limit, max_depth, 0)


def tree_depth_bounds(
    ranks: list[int | None], costs: list[float], budget: int, max_depth: int, spine_only: bool = False
) -> DepthBounds:
    """How deep the walk goes down a best-first tree when the truth at depth d has rank ranks[d-1].

    A model of core/tree.py's rule written from its contract, not its code: the tree is the
    `budget` most probable rank sequences (prefixes) of length <= max_depth with ranks <
    len(costs); a prefix's cost is the sum of its ranks' costs. A prefix is surely in the tree
    when at most `budget` prefixes cost no more than it (ties included), surely out when
    `budget` prefixes cost strictly less. `spine_only`: the hybrid `spine` mode verifies only
    the rank-0 chain of that tree.

    Args:
        ranks: the truth's rank per depth (None: absent from the draft).
        costs: -log p per rank, ascending (`rank_costs`).
        budget: drafted nodes in the tree.
        max_depth: the draft depth L of this step.

    Returns:
        DepthBounds for the accepted depth.
    """
    low = high = 0
    surely_in = True
    cost = 0.0
    for depth in range(1, max_depth + 1):
        rank = ranks[depth - 1]
        if rank is None or rank >= len(costs) or (spine_only and rank != 0):
            break
        cost += costs[rank]
        not_worse = _count_cheaper(costs, max_depth, cost + COST_TIE, budget + 1)
        better = _count_cheaper(costs, max_depth, cost - COST_TIE, budget)
        if better >= budget:
            break
        surely_in = surely_in and not_worse <= budget
        high = depth
        if surely_in:
            low = depth
    return DepthBounds(low, high)


def step_depth_bounds(
    drafter: OracleDrafter, spec: SpeculativeConfig, hybrid: bool, step: int, max_depth: int
) -> DepthBounds:
    """DepthBounds of verify step `step` drafting `max_depth` positions with `drafter`."""
    ranks = [drafter.rank_rule(step, d) for d in range(1, max_depth + 1)]
    if spec.algorithm == "dflash":
        # The argmax chain: accepted as long as the truth is rank 0.
        depth = next((d for d, r in enumerate(ranks) if r != 0), max_depth)
        return DepthBounds(depth, depth)
    k = min(spec.topk, spec.budget, drafter.vocab_size)
    spine_only = hybrid and spec.hybrid_mode == "spine"
    return tree_depth_bounds(ranks, rank_costs(drafter, k), spec.budget, max_depth, spine_only)


def draft_steps(result: GenerationResult, block_size: int, max_new_tokens: int) -> list[tuple[int | None, int]]:
    """(drafter step or None, draft depth) of every verify step of `result` (a run without stop
    tokens), replaying how generate() sizes a draft: min(block_size - 1, tokens still to emit
    - 1); with nothing to draft it verifies the root alone and does not call the drafter."""
    out, emitted, drafter_step = [], 1, 0
    for stats in result.steps:
        depth = min(block_size - 1, max_new_tokens - emitted - 1)
        out.append((drafter_step if depth > 0 else None, max(depth, 0)))
        drafter_step += depth > 0
        emitted += stats.committed
    return out


def expected_depths(
    result: GenerationResult, drafter: OracleDrafter, spec: SpeculativeConfig, hybrid: bool, max_new_tokens: int
) -> list[DepthBounds]:
    """DepthBounds of every verify step of `result`, a T=0 run without stop tokens."""
    return [
        DepthBounds(0, 0) if step is None else step_depth_bounds(drafter, spec, hybrid, step, depth)
        for step, depth in draft_steps(result, drafter.block_size, max_new_tokens)
    ]


def accepted_non_first(result: GenerationResult, drafter: OracleDrafter, max_new_tokens: int) -> list[tuple[int, int]]:
    """(drafter step, depth) of every accepted drafted token that was not its parent's first
    child (rank >= 1). Only the truth can match the target, so an accepted depth d means the
    token the rule put at rank rule(step, d) was taken."""
    found = []
    for (step, _), stats in zip(draft_steps(result, drafter.block_size, max_new_tokens), result.steps):
        for d in range(1, stats.accepted_drafts + 1):
            if (drafter.rank_rule(step, d) or 0) >= 1:
                found.append((step, d))
    return found


# --- the cache invariant ------------------------------------------------------------------

# Tree verify and a plain prefill do the same float64 arithmetic in other groupings: they
# agree to about 1e-16 (measured on the tiny targets); a wrong commit is off by 1e-3 or more.
CACHE_ATOL = 1e-10


@contextlib.contextmanager
def recording_caches(runner: TargetRunner) -> Iterator[list[TargetCache]]:
    """Collect the caches `runner.new_cache()` hands out inside the block (generate() keeps its
    cache to itself); the real method still builds them."""
    made: list[TargetCache] = []
    build = runner.new_cache

    def new_cache() -> TargetCache:
        made.append(build())
        return made[-1]

    runner.new_cache = new_cache
    try:
        yield made
    finally:
        del runner.new_cache


def prefill_cache(runner: TargetRunner, token_ids: list[int]) -> TargetCache:
    """The cache of one plain linear forward over `token_ids`, committed whole."""
    cache = runner.new_cache()
    n = len(token_ids)
    out = runner.forward(cache, torch.tensor(token_ids), flattened_parents(n), torch.arange(n), linear=True)
    runner.commit(cache, out, list(range(n)))
    return cache


def cache_mismatches(got: TargetCache, want: TargetCache, atol: float = CACHE_ATOL) -> list[str]:
    """What differs between two caches: length, and per layer the attention K/V or the
    Gated-DeltaNet conv window and recurrent state (max abs diff over `atol`). Empty: equal."""
    problems = []
    if got.length != want.length:
        problems.append(f"length {got.length} != {want.length}")
    for i, (a, b) in enumerate(zip(got.layers, want.layers)):
        for name in ("k", "v", "window", "state"):
            x, y = getattr(a, name), getattr(b, name)
            if x is None and y is None:
                continue
            if x is None or y is None or x.shape != y.shape:
                problems.append(f"layer {i} {name}: shape {None if x is None else tuple(x.shape)} != "
                                f"{None if y is None else tuple(y.shape)}")
                continue
            diff = (x - y).abs().max().item() if x.numel() else 0.0
            if not diff <= atol:
                problems.append(f"layer {i} {name}: max abs diff {diff:.2e} > {atol:.0e}")
    return problems


def wrong_state_node(path: list[int]) -> int:
    """The slip the mutation tests patch into reference/target.py's `committed_state_node`: the
    node at flattened index len(path) - 1 instead of the path's last node."""
    return len(path) - 1


def ar_tokens(runner: TargetRunner, prompt: list[int], max_new_tokens: int) -> list[int]:
    """ar's greedy tokens after `prompt`, without stop tokens: the ground truth of a T=0 run."""
    params = SamplingParams(max_new_tokens=max_new_tokens)
    return generate(runner, None, prompt, SpeculativeConfig("ar"), params).token_ids


def committed_tokens(prompt: list[int], result: GenerationResult) -> list[int]:
    """What generate() leaves in the target's cache: the prompt and every emitted token but the
    last, which is the next step's root and not verified yet."""
    return prompt + result.token_ids[:-1]


@dataclass
class CheckedRun:
    """One T=0 generation held against ar: `mismatch` (first differing index, or None), the
    cache problems, and (oracle drafters only) the steps whose accepted depth is out of bounds."""

    result: GenerationResult
    mismatch: int | None
    cache_problems: list[str]
    depth_problems: list[str]

    def failures(self) -> list[str]:
        head = [] if self.mismatch is None else [f"tokens differ from ar at index {self.mismatch}"]
        return head + self.cache_problems + self.depth_problems


def checked_run(
    runner: TargetRunner,
    drafter,
    prompt: list[int],
    spec: SpeculativeConfig,
    reference: list[int],
    max_new_tokens: int,
    cache_atol: float = CACHE_ATOL,
) -> CheckedRun:
    """generate() at T=0 without stop tokens, checked three ways: tokens equal `reference` (ar's),
    the final cache equals a prefill of the committed tokens (within `cache_atol`), and (for an
    OracleDrafter) every step accepted the depth `expected_depths` allows."""
    with recording_caches(runner) as made:
        result = generate(runner, drafter, prompt, spec, SamplingParams(max_new_tokens=max_new_tokens))
    tokens = result.token_ids
    mismatch = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), None)
    if mismatch is None and len(tokens) != len(reference):
        mismatch = min(len(tokens), len(reference))
    cache = cache_mismatches(made[0], prefill_cache(runner, committed_tokens(prompt, result)), cache_atol)
    depth = []
    if isinstance(drafter, OracleDrafter):
        bounds = expected_depths(result, drafter, spec, runner.is_hybrid, max_new_tokens)
        for i, (b, stats) in enumerate(zip(bounds, result.steps)):
            if not b.low <= stats.accepted_drafts <= b.high:
                depth.append(f"step {i}: accepted {stats.accepted_drafts}, expected {b.low}..{b.high}")
    return CheckedRun(result, mismatch, cache, depth)


def run(engine: ReferenceEngine, prompt: list[int], spec: SpeculativeConfig, max_new_tokens: int = 24, drafter=None, **kw):
    saved_spec, saved_drafter = engine.spec, engine.drafter
    engine.spec = spec
    if drafter is not None:
        engine.drafter = drafter
    try:
        return engine.generate(prompt, SamplingParams(max_new_tokens=max_new_tokens, **kw))
    finally:
        engine.spec, engine.drafter = saved_spec, saved_drafter
