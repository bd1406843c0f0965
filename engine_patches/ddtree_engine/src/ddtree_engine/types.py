"""What the server, the CLI and every backend share: settings, results, per-step stats, and the
`Engine` Protocol a backend implements.

This module is the engine's neutral floor: it imports neither torch nor a backend, so the
server and the CLI type against it without loading the Hugging Face backend, and another
backend (a kernel-backed one, an SGLang adapter) returns the same results.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from .errors import BadInputError

ALGORITHMS = ("ar", "dflash", "ddtree")
HYBRID_MODES = ("safe", "spine", "unsafe")

UNSAFE_WARNING = (
    "hybrid_mode 'unsafe' verifies Gated-DeltaNet layers in flattened tree order: sibling nodes "
    "leak recurrent state into each other and the output is NOT the target's. Diagnosis only."
)

TokenCallback = Callable[[list[int]], bool | None]
"""Streaming callback: receives each newly committed chunk of token ids; returning True stops
generation there (a stop string completed, or the client went away), finish_reason "stop"."""


@dataclass(frozen=True)
class SpeculativeConfig:
    """How the engine speculates. `budget`/`topk`/`spine_depth` only matter for `ddtree`."""

    algorithm: Literal["ar", "dflash", "ddtree"] = "ddtree"
    budget: int = 15
    topk: int = 8
    spine_depth: int = 0
    hybrid_mode: Literal["safe", "spine", "unsafe"] = "safe"
    allow_hybrid_unsafe: bool = False


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class StepStats:
    """One verify step (one target forward over the tree or chain)."""

    tree_nodes: int  # drafted nodes verified, root excluded
    accepted_drafts: int  # drafted tokens accepted (= accepted depth)
    committed: int  # tokens emitted by this step (accepted drafts + bonus, cut by stop/max tokens)


@dataclass
class GenerationResult:
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: Literal["stop", "length"]
    steps: list[StepStats] = field(default_factory=list)

    @property
    def verify_steps(self) -> int:
        return len(self.steps)

    @property
    def accepted_per_step(self) -> list[int]:
        return [s.committed for s in self.steps]


def validate_tree_args(budget: int, topk: int) -> None:
    """Raise BadInputError unless `budget` >= 0 and `topk` >= 1.

    Args:
        budget: drafted tree nodes per verify step.
        topk: candidates kept per depth.
    """
    if budget < 0:
        raise BadInputError(f"budget must be >= 0 (the number of drafted tree nodes), got {budget}")
    if topk < 1:
        raise BadInputError(f"topk must be >= 1 (candidates kept per depth), got {topk}")


def validate_spec(spec: SpeculativeConfig, drafter: object | None = None) -> None:
    """Raise BadInputError for settings no backend can run; warn (RuntimeWarning) for `unsafe`.

    Args:
        spec: the settings to check.
        drafter: the drafter (or any stand-in object when one will be loaded); None when there
            is none, which only `ar` accepts.
    """
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


@runtime_checkable
class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the server and the CLI use."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int], **kwargs: Any) -> str: ...

    def __len__(self) -> int: ...


@runtime_checkable
class Engine(Protocol):
    """What the server and the CLI need from a backend (batch size 1, not thread-safe).

    Metrics travel with each result: `GenerationResult.steps` holds one StepStats per verify
    step, which the server turns into its Prometheus counters and journal lines, so every
    backend reports acceptance the same way.
    """

    tokenizer: Tokenizer

    def generate(
        self, prompt_ids: list[int], params: SamplingParams, on_tokens: TokenCallback | None = None
    ) -> GenerationResult:
        """Generate after `prompt_ids`.

        Args:
            prompt_ids: the prompt's token ids (at least one, all inside the vocabulary).
            params: sampling settings; the backend adds its end-of-sequence token to the stops.
            on_tokens: streaming callback for each committed chunk (see TokenCallback).

        Returns:
            The tokens, the prompt length, the finish reason and the per-step stats.
        """
        ...

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        """Token ids of `messages` ({"role", "content"} dicts) in the target's chat template,
        ready for the assistant's reply."""
        ...

    def server_info(self) -> dict[str, Any]:
        """The `/server_info` fields this engine owns: at least `speculative_algorithm`,
        `speculative_ddtree_budget`, `speculative_ddtree_topk`, `speculative_num_draft_tokens`,
        `model_path` and `version` (see the server contract in the README)."""
        ...


ENGINE_MEMBERS = tuple(Engine.__annotations__) + tuple(
    name for name, value in vars(Engine).items() if callable(value) and not name.startswith("_")
)


def missing_engine_members(obj: object) -> list[str]:
    """The `Engine` members `obj` lacks: what `isinstance(obj, Engine)` finds missing.

    Args:
        obj: a candidate engine.

    Returns:
        Member names in the Protocol's order; empty when `obj` is an Engine.
    """
    return [name for name in ENGINE_MEMBERS if not hasattr(obj, name)]
