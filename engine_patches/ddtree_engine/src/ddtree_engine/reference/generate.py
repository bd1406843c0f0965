"""The generation loop. One `step`: draft -> build -> verify -> walk -> commit."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from ..core.hybrid import flattened_parents
from ..core.sampling import choose_tokens
from ..core.tree import DraftTree, build_tree, chain_tree, compile_tree, spine_of, validate_tree_args
from ..core.walk import walk
from ..errors import BadInputError
from .drafters import Drafter
from .target import TargetCache, TargetRunner
from .types import ALGORITHMS, HYBRID_MODES, GenerationResult, SamplingParams, SpeculativeConfig, StepStats

UNSAFE_WARNING = (
    "hybrid_mode 'unsafe' verifies Gated-DeltaNet layers in flattened tree order: sibling nodes "
    "leak recurrent state into each other and the output is NOT the target's. Diagnosis only."
)


def validate_spec(spec: SpeculativeConfig, runner: TargetRunner | None = None, drafter: Drafter | None = None) -> None:
    """Raise BadInputError for settings that cannot work; warn for `unsafe`."""
    if spec.algorithm not in ALGORITHMS:
        raise BadInputError(f"unknown algorithm {spec.algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    if spec.hybrid_mode not in HYBRID_MODES:
        raise BadInputError(f"unknown hybrid mode {spec.hybrid_mode!r}; choose one of {', '.join(HYBRID_MODES)}")
    validate_tree_args(spec.budget, spec.topk)
    if spec.spine_depth < 0:
        raise BadInputError(f"spine_depth must be >= 0, got {spec.spine_depth}")
    if spec.hybrid_mode == "unsafe":
        if not spec.allow_hybrid_unsafe:
            raise BadInputError(
                "hybrid mode 'unsafe' reproduces sibling state leakage and corrupts output on hybrid models; "
                "it is refused unless explicitly allowed (--allow-hybrid-unsafe, or allow_hybrid_unsafe=True)"
            )
        warnings.warn(UNSAFE_WARNING, RuntimeWarning, stacklevel=2)
    if spec.algorithm != "ar" and drafter is None:
        raise BadInputError(f"algorithm {spec.algorithm!r} needs a drafter")


def draft_tree(spec: SpeculativeConfig, draft_logits: torch.Tensor, root: int, hybrid: bool) -> DraftTree:
    """The tree (or chain) this step verifies."""
    if spec.algorithm == "dflash":
        return chain_tree(draft_logits.argmax(dim=-1), root)
    tree = build_tree(draft_logits, spec.budget, spec.topk, root, spec.spine_depth)
    if hybrid and spec.hybrid_mode == "spine":
        return spine_of(tree)
    return tree


def _stop_cut(tokens: list[int], stop_ids: tuple[int, ...]) -> tuple[list[int], bool]:
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return tokens[: i + 1], True
    return tokens, False


@torch.inference_mode()
def generate(
    runner: TargetRunner,
    drafter: Drafter | None,
    prompt_ids: list[int],
    spec: SpeculativeConfig,
    params: SamplingParams,
    on_tokens: Callable[[list[int]], bool | None] | None = None,
) -> GenerationResult:
    """Generate up to `params.max_new_tokens` tokens after `prompt_ids` (batch size 1).

    Every emitted token is the target's own choice (argmax at T=0, a sample at T>0) in its
    true context, so `dflash` and `ddtree` emit exactly what `ar` emits at T=0.
    `on_tokens` receives each committed chunk; returning True stops generation there
    (a stop string completed, or the client went away), with finish_reason "stop".
    """
    if not prompt_ids:
        raise BadInputError("the prompt is empty: give at least one token")
    if params.max_new_tokens < 1:
        raise BadInputError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if params.temperature < 0:
        raise BadInputError(f"temperature must be >= 0, got {params.temperature}")
    bad = [t for t in prompt_ids if not 0 <= t < runner.vocab_size]
    if bad:
        raise BadInputError(f"prompt token ids {bad[:5]} are outside the vocabulary (0..{runner.vocab_size - 1})")
    speculate = spec.algorithm != "ar"
    generator = None
    if params.temperature > 0:
        generator = torch.Generator(device="cpu")
        generator.manual_seed(params.seed if params.seed is not None else torch.seed())
    capture = drafter.capture_layers if speculate else []
    unsafe = speculate and runner.is_hybrid and spec.hybrid_mode == "unsafe"

    cache: TargetCache = runner.new_cache()
    prompt = torch.tensor(prompt_ids, dtype=torch.long)
    n = len(prompt_ids)
    out = runner.forward(cache, prompt, flattened_parents(n), torch.arange(n), capture, linear=True)
    runner.commit(cache, out, list(range(n)))
    if speculate:
        drafter.reset()
        drafter.observe(prompt_ids, out.features, torch.arange(n))
    first = int(choose_tokens(out.logits[-1:], params.temperature, generator)[0])
    emitted = [first]
    result = GenerationResult(token_ids=emitted, prompt_tokens=n, finish_reason="length")
    caller_stop = bool(on_tokens and on_tokens([first]))
    if first in params.stop_token_ids or caller_stop:
        result.finish_reason = "stop"
        return result

    root = first
    while len(emitted) < params.max_new_tokens:
        remaining = params.max_new_tokens - len(emitted)
        if speculate:
            # No point drafting past what may still be emitted (accepted drafts + the bonus).
            depth = min(drafter.block_size - 1, remaining - 1)
            logits = drafter.propose(root, cache.length, depth) if depth > 0 else torch.zeros(0, runner.vocab_size)
            tree = draft_tree(spec, logits, root, runner.is_hybrid)
        else:
            tree = chain_tree([], root)
        compiled = compile_tree(tree, cache.length)
        hybrid_parents = flattened_parents(tree.num_nodes) if unsafe else None
        out = runner.forward(cache, tree.tokens, tree.parents, tree.depths, capture, hybrid_parents=hybrid_parents)
        choices = choose_tokens(out.logits, params.temperature, generator)
        walked = walk(compiled, choices)
        first_pos = cache.length
        runner.commit(cache, out, walked.path)
        if speculate:
            path = torch.tensor(walked.path)
            features = out.features[path] if out.features is not None else None
            drafter.observe([root, *walked.accepted_tokens], features, torch.arange(first_pos, first_pos + len(path)))
        new = [*walked.accepted_tokens, walked.bonus_token][:remaining]
        new, stopped = _stop_cut(new, params.stop_token_ids)
        emitted.extend(new)
        result.steps.append(
            StepStats(tree_nodes=tree.num_nodes - 1, accepted_drafts=walked.accepted_drafts, committed=len(new))
        )
        if on_tokens and on_tokens(new):
            stopped = True
        if stopped:
            result.finish_reason = "stop"
            break
        root = walked.bonus_token
    return result
