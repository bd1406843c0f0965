"""`ar` is the reference every other test trusts, so it is held against the Hugging Face model
it wraps: the runner's prefill logits against the model's own forward, its decode logits against
`generate`'s per-step logits, and its greedy tokens against `generate`'s, per architecture.

Tolerances (max abs logit diff, prefill and decode; measured in brackets): Qwen3 in float64,
1e-10 [0]; Qwen3-Next in float64, 1e-6 [1.2e-7: Hugging Face runs the gated delta rule in
float32]; Qwen3.5 likewise, 1e-6 [6e-8]; the lab pair (Qwen3.5) in float32, 5e-4 [trained 1.1e-5, slow decay 6e-5; logits up to ~19]."""

from __future__ import annotations

import contextlib

import pytest
import torch
from engine_oracle import ARCHES

from ddtree_engine.core.hybrid import flattened_parents
from ddtree_engine.reference.generate import generate
from ddtree_engine.reference.models import load_target, load_tokenizer
from ddtree_engine.reference.target import TargetRunner
from ddtree_engine.reference.tiny import set_gdn_decay
from ddtree_engine.types import SamplingParams, SpeculativeConfig
from ddtree_ops.compare.prompts import BUILTIN_PROMPTS

MAX_NEW = 32
TOLERANCE = {"qwen3": 1e-10, "qwen3-next": 1e-6, "qwen3.5": 1e-6, "lab": 5e-4}
TINY_PROMPTS = ([60, 9, 200, 33, 101], [(i * 37 + 11) % 256 for i in range(23)])


@contextlib.contextmanager
def recording_logits(runner: TargetRunner):
    """Collect the last row of the logits of every `runner.forward` inside the block: in `ar`,
    the logits each emitted token was chosen from."""
    rows: list[torch.Tensor] = []
    forward = runner.forward

    def spy(*args, **kwargs):
        out = forward(*args, **kwargs)
        rows.append(out.logits[-1])
        return out

    runner.forward = spy
    try:
        yield rows
    finally:
        del runner.forward


def hf_greedy(model, prompt: list[int], max_new_tokens: int, stop_ids: tuple[int, ...]):
    """Hugging Face `generate` at T=0: (tokens, per-step logits [n, V])."""
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=list(stop_ids) or None,
        pad_token_id=model.config.pad_token_id,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), generation_config=config)
    return out.sequences[0, len(prompt):].tolist(), torch.cat(out.logits).float()


def assert_ar_matches_hf(runner: TargetRunner, prompt: list[int], tolerance: float, stop_ids: tuple[int, ...]):
    model = runner.model
    n = len(prompt)
    ours = runner.forward(runner.new_cache(), torch.tensor(prompt), flattened_parents(n), torch.arange(n), linear=True)
    with torch.no_grad():
        theirs = model(torch.tensor([prompt])).logits[0].float()
    diff = (ours.logits - theirs).abs().max().item()
    assert diff <= tolerance, f"prefill logits: max abs diff {diff:.2e} > {tolerance:.0e}"

    params = SamplingParams(max_new_tokens=MAX_NEW, stop_token_ids=stop_ids)
    with recording_logits(runner) as rows:
        result = generate(runner, None, prompt, SpeculativeConfig("ar"), params)
    hf_tokens, hf_logits = hf_greedy(model, prompt, MAX_NEW, stop_ids)
    assert result.token_ids == hf_tokens
    step_diff = (torch.stack(rows) - hf_logits).abs().max().item()
    assert step_diff <= tolerance, f"decode logits: max abs diff {step_diff:.2e} > {tolerance:.0e}"
    return diff, step_diff


@pytest.mark.parametrize("arch", ARCHES)
def test_ar_matches_hugging_face_on_tiny_targets(engines, arch):
    runner = engines[arch].runner
    eos = runner.config.eos_token_id
    for prompt in TINY_PROMPTS:
        assert_ar_matches_hf(runner, prompt, TOLERANCE[arch], (eos,))


@pytest.mark.parametrize("slow_decay", [False, True], ids=["trained", "slow-decay"])
def test_ar_matches_hugging_face_on_the_lab_pair(slow_decay):
    model = load_target("lab", torch.device("cpu"), torch.float32)
    if slow_decay:
        set_gdn_decay(model)
    runner = TargetRunner(model)
    tokenizer = load_tokenizer("lab")
    for prompt in BUILTIN_PROMPTS[:2]:
        messages = [dict(m) for m in prompt.messages]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        assert_ar_matches_hf(runner, ids, TOLERANCE["lab"], (runner.config.eos_token_id,))
