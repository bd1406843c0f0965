"""Test support for the engine: an oracle drafter that makes long accepted paths (and sibling
acceptances) happen on demand, and a helper to run an engine with another spec or drafter."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from ddtree_engine.reference.engine import ReferenceEngine
from ddtree_engine.types import SamplingParams, SpeculativeConfig

ARCHES = ("qwen3", "qwen3-next")

RankRule = Callable[[int, int], "int | None"]


class OracleDrafter:
    """A drafter that knows the target's greedy continuation.

    At verify step s and depth d (1-based) it places the true next token at rank
    `rank_rule(s, d)` of its distribution (None: the true token is absent). The other
    ranks are filled with seeded random tokens, with logits `spacing` apart (small: siblings compete; large: a confident chain).
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

    def propose(self, root_token: int, root_position: int, num_positions: int) -> torch.Tensor:
        logits = torch.empty(num_positions, self.vocab_size, dtype=torch.float32)
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
            # Rank r gets logit -spacing * r: with the default, the top few ranks compete.
            values = -self.spacing * torch.arange(self.vocab_size, dtype=torch.float32)
            logits[d, torch.tensor(order)] = values
        self.step += 1
        return logits


def rule_deep(step: int, depth: int) -> int | None:
    """Always the argmax: every block accepted to full depth."""
    return 0


def rule_siblings(step: int, depth: int) -> int | None:
    """Non-first siblings accepted at depth >= 2 (rank 1 or 2), misses now and then."""
    pattern = [0, 1, 0, 2, 1, 0, 0, 1, None, 0, 0, 0, 1, 0, 0]
    return pattern[(depth - 1 + step) % len(pattern)]


def make_rule_noisy(seed: int) -> RankRule:
    rng = random.Random(seed)
    cache: dict[tuple[int, int], int | None] = {}

    def rule(step: int, depth: int) -> int | None:
        if (step, depth) not in cache:
            cache[(step, depth)] = rng.choice([0, 0, 0, 1, 1, 2, 3, None])
        return cache[(step, depth)]

    return rule


def run(engine: ReferenceEngine, prompt: list[int], spec: SpeculativeConfig, max_new_tokens: int = 24, drafter=None, **kw):
    saved_spec, saved_drafter = engine.spec, engine.drafter
    engine.spec = spec
    if drafter is not None:
        engine.drafter = drafter
    try:
        return engine.generate(prompt, SamplingParams(max_new_tokens=max_new_tokens, **kw))
    finally:
        engine.spec, engine.drafter = saved_spec, saved_drafter
