"""The named steps of one request: prefill, then per verify step draft -> build -> verify -> walk
-> commit. Each is a plain function of a `DecodeState` and the previous step's output, so a
kernel or another backend replaces one at a time:

    steps = dataclasses.replace(REFERENCE_STEPS, walk=my_walk)
    generate(runner, drafter, prompt_ids, spec, params, steps=steps)

Shapes: draft logits [L, V] (L = drafted depths, 0 for `ar`); a tree of N = 1 + drafted nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..core.hybrid import flattened_parents
from ..core.sampling import choose_tokens
from ..core.tree import CompiledTree, build_tree, chain_tree, compile_tree, spine_of
from ..core.walk import WalkResult
from ..core.walk import walk as walk_tree
from ..kernels.dispatch import use_kernel
from ..types import SamplingParams, SpeculativeConfig, StepStats
from .drafters import Drafter
from .target import ForwardOutput, TargetCache, TargetRunner


@dataclass
class DecodeState:
    """What one request's steps share (batch size 1). `cache` and the drafter's context change
    only in `prefill` and `commit`."""

    runner: TargetRunner
    drafter: Drafter | None
    spec: SpeculativeConfig
    params: SamplingParams
    cache: TargetCache
    generator: torch.Generator | None  # None at T=0 (argmax)

    @property
    def speculate(self) -> bool:
        return self.spec.algorithm != "ar"

    @property
    def capture_layers(self) -> list[int]:
        return list(self.drafter.capture_layers) if self.speculate else []

    @property
    def flattened_hybrid(self) -> bool:
        """The `unsafe` mode: Gated-DeltaNet layers see the flattened order, not the tree."""
        return self.speculate and self.runner.is_hybrid and self.spec.hybrid_mode == "unsafe"


@dataclass(frozen=True)
class Committed:
    """What one verify step emits: `tokens` (accepted drafts + bonus, cut at `remaining` and at
    the first stop token), whether a stop token ended them, and the step's stats."""

    tokens: list[int]
    stopped: bool
    stats: StepStats


def new_state(
    runner: TargetRunner, drafter: Drafter | None, spec: SpeculativeConfig, params: SamplingParams
) -> DecodeState:
    """A fresh request: an empty target cache, and a seeded generator when sampling (T > 0).

    Args:
        runner: the target.
        drafter: the drafter (None only for `ar`).
        spec, params: the request's speculation and sampling settings.

    Returns:
        The state the steps share.
    """
    generator = None
    if params.temperature > 0:
        generator = torch.Generator(device="cpu")
        generator.manual_seed(params.seed if params.seed is not None else torch.seed())
    return DecodeState(runner, drafter, spec, params, runner.new_cache(), generator)


def prefill(state: DecodeState, prompt_ids: list[int]) -> int:
    """Run and commit the prompt; show it to the drafter.

    Returns:
        The first generated token (the target's choice after the prompt).
    """
    n = len(prompt_ids)
    prompt = torch.tensor(prompt_ids, dtype=torch.long)
    out = state.runner.forward(
        state.cache, prompt, flattened_parents(n), torch.arange(n), state.capture_layers, linear=True
    )
    state.runner.commit(state.cache, out, list(range(n)))
    if state.speculate:
        state.drafter.reset()
        state.drafter.observe(prompt_ids, out.features, torch.arange(n))
    return int(choose_tokens(out.logits[-1:], state.params.temperature, state.generator)[0])


def draft(state: DecodeState, root: int, remaining: int) -> torch.Tensor:
    """The drafter's logits [L, V] for the L positions after `root` (L = 0 for `ar`).

    Args:
        root: the last committed token, not yet verified (node 0 of the tree).
        remaining: tokens the request may still emit; no depth past `remaining - 1` is drafted
            (accepted drafts + the bonus token cannot exceed it).
    """
    vocab = state.runner.vocab_size
    if not state.speculate:
        return torch.zeros(0, vocab)
    depth = min(state.drafter.block_size - 1, remaining - 1)
    if depth <= 0:
        return torch.zeros(0, vocab)
    return state.drafter.propose(root, state.cache.length, depth)


def build(state: DecodeState, draft_logits: torch.Tensor, root: int) -> CompiledTree:
    """The tree (ddtree) or chain (dflash; the root alone for ar) this step verifies, compiled
    at the cache's length."""
    spec = state.spec
    if spec.algorithm == "ddtree":
        tree = build_tree(draft_logits, spec.budget, spec.topk, root, spec.spine_depth)
        if state.runner.is_hybrid and spec.hybrid_mode == "spine":
            tree = spine_of(tree)
    else:
        tree = chain_tree(draft_logits.argmax(dim=-1), root)
    return compile_tree(tree, state.cache.length)


def verify(state: DecodeState, compiled: CompiledTree) -> ForwardOutput:
    """One target forward over every node (the cache is not changed)."""
    tree = compiled.tree
    hybrid_parents = flattened_parents(tree.num_nodes) if state.flattened_hybrid else None
    return state.runner.forward(
        state.cache, tree.tokens, tree.parents, tree.depths, state.capture_layers, hybrid_parents=hybrid_parents
    )


def walk(state: DecodeState, compiled: CompiledTree, verified: ForwardOutput) -> WalkResult:
    """The target's choice at every node (argmax at T=0, one sample per node at T>0), walked
    from the root: the accepted path and the bonus token. At T=0 on CUDA (or with
    DDTREE_KERNELS=triton) the argmax stays on the device and the walk kernel takes it."""
    if state.params.temperature <= 0 and use_kernel(verified.logits):
        return walk_tree(compiled, verified.logits.argmax(dim=-1))
    choices = choose_tokens(verified.logits, state.params.temperature, state.generator)
    return walk_tree(compiled, choices)


def commit(
    state: DecodeState, compiled: CompiledTree, verified: ForwardOutput, walked: WalkResult, remaining: int
) -> Committed:
    """Keep the accepted path in the target's cache and the drafter's context; cut the tokens
    this step emits at `remaining` and at the first stop token."""
    first_position = state.cache.length
    state.runner.commit(state.cache, verified, walked.path)
    if state.speculate:
        path = torch.tensor(walked.path)
        features = verified.features[path] if verified.features is not None else None
        positions = torch.arange(first_position, first_position + len(path))
        state.drafter.observe(compiled.tree.tokens[path].tolist(), features, positions)
    tokens, stopped = _cut_at_stop([*walked.accepted_tokens, walked.bonus_token][:remaining], state.params)
    stats = StepStats(
        tree_nodes=compiled.tree.num_nodes - 1, accepted_drafts=walked.accepted_drafts, committed=len(tokens)
    )
    return Committed(tokens=tokens, stopped=stopped, stats=stats)


def _cut_at_stop(tokens: list[int], params: SamplingParams) -> tuple[list[int], bool]:
    for i, t in enumerate(tokens):
        if t in params.stop_token_ids:
            return tokens[: i + 1], True
    return tokens, False


@dataclass(frozen=True)
class DecodeSteps:
    """The functions `generate` calls, by name; replace any with `dataclasses.replace`."""

    prefill: Callable[[DecodeState, list[int]], int] = prefill
    draft: Callable[[DecodeState, int, int], torch.Tensor] = draft
    build: Callable[[DecodeState, torch.Tensor, int], CompiledTree] = build
    verify: Callable[[DecodeState, CompiledTree], ForwardOutput] = verify
    walk: Callable[[DecodeState, CompiledTree, ForwardOutput], WalkResult] = walk
    commit: Callable[[DecodeState, CompiledTree, ForwardOutput, WalkResult, int], Committed] = commit


REFERENCE_STEPS = DecodeSteps()
