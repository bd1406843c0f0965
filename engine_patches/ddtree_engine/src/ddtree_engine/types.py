"""Plain data passed between the generation loop, the CLI and the server."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

ALGORITHMS = ("ar", "dflash", "ddtree")
HYBRID_MODES = ("safe", "spine", "unsafe")


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
