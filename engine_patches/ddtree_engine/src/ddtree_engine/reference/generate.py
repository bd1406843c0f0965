"""The generation loop: prefill, then one verify step after another (draft -> build -> verify
-> walk -> commit, the functions of `steps.DecodeSteps`) until the request is done."""

from __future__ import annotations

import torch

from ..errors import BadInputError
from ..types import GenerationResult, SamplingParams, SpeculativeConfig, TokenCallback
from .drafters import Drafter
from .steps import REFERENCE_STEPS, DecodeSteps, new_state
from .target import TargetRunner


def check_request(runner: TargetRunner, prompt_ids: list[int], params: SamplingParams) -> None:
    """Raise BadInputError for a request no step can run (empty prompt, ids outside the
    vocabulary, max_new_tokens < 1, temperature < 0)."""
    if not prompt_ids:
        raise BadInputError("the prompt is empty: give at least one token")
    if params.max_new_tokens < 1:
        raise BadInputError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if params.temperature < 0:
        raise BadInputError(f"temperature must be >= 0, got {params.temperature}")
    bad = [t for t in prompt_ids if not 0 <= t < runner.vocab_size]
    if bad:
        raise BadInputError(f"prompt token ids {bad[:5]} are outside the vocabulary (0..{runner.vocab_size - 1})")


@torch.inference_mode()
def generate(
    runner: TargetRunner,
    drafter: Drafter | None,
    prompt_ids: list[int],
    spec: SpeculativeConfig,
    params: SamplingParams,
    on_tokens: TokenCallback | None = None,
    steps: DecodeSteps = REFERENCE_STEPS,
) -> GenerationResult:
    """Generate up to `params.max_new_tokens` tokens after `prompt_ids` (batch size 1).

    Every emitted token is the target's own choice (argmax at T=0, a sample at T>0) in its
    true context, so `dflash` and `ddtree` emit exactly what `ar` emits at T=0.

    Args:
        runner, drafter: the target and its drafter (None only for `ar`).
        prompt_ids: the prompt's token ids.
        spec, params: speculation and sampling settings.
        on_tokens: receives each committed chunk; returning True stops generation there
            (a stop string completed, or the client went away), with finish_reason "stop".
        steps: the step functions; replace one to plug in a kernel or another backend's step.

    Returns:
        The tokens, the prompt length, the finish reason and one StepStats per verify step.
    """
    check_request(runner, prompt_ids, params)
    state = new_state(runner, drafter, spec, params)
    root = steps.prefill(state, prompt_ids)
    result = GenerationResult(token_ids=[root], prompt_tokens=len(prompt_ids), finish_reason="length")
    stopped = root in params.stop_token_ids
    stopped = bool(on_tokens and on_tokens([root])) or stopped
    while not stopped and len(result.token_ids) < params.max_new_tokens:
        remaining = params.max_new_tokens - len(result.token_ids)
        draft_logits = steps.draft(state, root, remaining)
        compiled = steps.build(state, draft_logits, root)
        verified = steps.verify(state, compiled)
        walked = steps.walk(state, compiled, verified)
        step = steps.commit(state, compiled, verified, walked, remaining)
        result.token_ids.extend(step.tokens)
        result.steps.append(step.stats)
        stopped = bool(on_tokens and on_tokens(step.tokens)) or step.stopped
        root = walked.bonus_token
    if stopped:
        result.finish_reason = "stop"
    return result
