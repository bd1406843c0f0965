"""The reference backend's engine: a loaded target, drafter and tokenizer that satisfies the
`types.Engine` Protocol the CLI and the server use."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .. import __version__
from ..types import GenerationResult, SamplingParams, SpeculativeConfig, TokenCallback, Tokenizer, validate_spec
from .drafters import DFlashDrafter, Drafter
from .generate import generate
from .models import load_drafter, load_target, load_tokenizer, resolve_device, resolve_dtype
from .steps import REFERENCE_STEPS, DecodeSteps
from .target import TargetRunner


@dataclass
class ReferenceEngine:
    """DDTree on a Hugging Face `transformers` target (batch size 1). `steps` are the step
    functions `generate` runs; replace one to try a kernel."""

    runner: TargetRunner
    drafter: Drafter | None
    tokenizer: Tokenizer
    spec: SpeculativeConfig
    model_path: str
    draft_path: str | None
    steps: DecodeSteps = field(default=REFERENCE_STEPS)

    def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        on_tokens: TokenCallback | None = None,
    ) -> GenerationResult:
        """Generate after `prompt_ids`; `on_tokens` receives each newly committed chunk and may
        return True to stop there. Not thread-safe."""
        stop = set(params.stop_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            stop.add(self.tokenizer.eos_token_id)
        params = SamplingParams(
            max_new_tokens=params.max_new_tokens,
            temperature=params.temperature,
            seed=params.seed,
            stop_token_ids=tuple(sorted(stop)),
        )
        return generate(self.runner, self.drafter, prompt_ids, self.spec, params, on_tokens, self.steps)

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        """Token ids of `messages` rendered with the target's chat template, ready for the reply."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    @property
    def block_size(self) -> int:
        return self.drafter.block_size if self.drafter is not None else 1

    def server_info(self) -> dict[str, Any]:
        """The `/server_info` fields of this engine (see `types.Engine.server_info`)."""
        spec = self.spec
        tree = spec.algorithm == "ddtree"
        return {
            "backend": "reference",
            "speculative_algorithm": spec.algorithm.upper(),
            "speculative_ddtree_budget": spec.budget if tree else None,
            "speculative_ddtree_topk": spec.topk if tree else None,
            "speculative_ddtree_spine_depth": spec.spine_depth if tree else None,
            "speculative_ddtree_hybrid_mode": spec.hybrid_mode,
            "speculative_num_draft_tokens": self.block_size if spec.algorithm != "ar" else None,
            "model_path": self.model_path,
            "context_length": getattr(self.runner.config, "max_position_embeddings", None),
            "draft_model_path": self.draft_path,
            "hybrid_target": self.runner.is_hybrid,
            "device": str(self.runner.device),
            "dtype": str(self.runner.dtype).removeprefix("torch."),
            "version": __version__,
        }


def load_engine(
    target: str,
    draft: str | None,
    spec: SpeculativeConfig,
    device: str = "auto",
    dtype: str = "auto",
) -> ReferenceEngine:
    """Load target (+ drafter unless `ar`) and check the settings before any generation.

    Args:
        target, draft: Hugging Face model directories, or "lab" for the built-in pair.
        spec: how to speculate (checked before anything loads).
        device, dtype: "auto" picks CUDA and bfloat16 when a GPU is visible, else CPU float32.

    Returns:
        A ReferenceEngine, which satisfies `types.Engine`.
    """
    validate_spec(spec, drafter=object() if draft or spec.algorithm == "ar" else None)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    model = load_target(target, dev, dt)
    runner = TargetRunner(model)
    drafter = None
    if spec.algorithm != "ar":
        drafter = DFlashDrafter(load_drafter(draft, model, dev, dt), model)
    tokenizer = load_tokenizer(target)
    torch.set_grad_enabled(False)
    return ReferenceEngine(
        runner=runner, drafter=drafter, tokenizer=tokenizer, spec=spec, model_path=target, draft_path=draft
    )
