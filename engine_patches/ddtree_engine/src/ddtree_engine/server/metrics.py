"""Server counters in Prometheus text format and the `DDTREE metrics:` journal line.

The metric names are SGLang's (`sglang:generation_tokens_total`, ...) so the health gate and the
compare tool read both backends the same way; `ddtree:*` are this engine's extras.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..types import GenerationResult, StepStats

JOURNAL_PREFIX = "DDTREE metrics:"

# (name, type, help) in exposition order; the counters are fields of MetricsSnapshot.
_COUNTERS = (
    ("sglang:prompt_tokens_total", "prompt_tokens", "Prompt tokens processed."),
    ("sglang:generation_tokens_total", "generation_tokens", "Tokens generated (prefill token included)."),
    ("sglang:num_requests_total", "num_requests", "Generation requests finished."),
    ("sglang:spec_verify_calls_total", "spec_verify_calls", "Target verify forwards (one per step)."),
    ("ddtree:tree_nodes_total", "tree_nodes", "Drafted nodes verified, roots excluded."),
    ("ddtree:accepted_drafts_total", "accepted_drafts", "Drafted tokens the target accepted."),
)


@dataclass(frozen=True)
class MetricsSnapshot:
    """Lifetime counters at one instant."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_requests: int = 0
    spec_verify_calls: int = 0
    tree_nodes: int = 0
    accepted_drafts: int = 0

    @property
    def spec_accept_length(self) -> float:
        """Generated tokens per verify call over the server's lifetime (0 before the first)."""
        if self.spec_verify_calls == 0:
            return 0.0
        return self.generation_tokens / self.spec_verify_calls


def format_journal_line(steps: Sequence[StepStats], budget: int, batch_size: int = 1) -> str:
    """The `DDTREE metrics:` line operators grep for, averaged over `steps`.

    Args:
        steps: the verify steps since the previous line (at least one).
        budget: the configured tree budget (drafted nodes per step).
        batch_size: requests per verify forward (this server runs 1).

    Returns:
        e.g. `DDTREE metrics: bs=1 budget=15 avg_actual_nodes=16.00 avg_accepted_drafts=6.00
        avg_commit_len=7.00 avg_accepted_depth=6.00` (one line; nodes count the root).
    """
    if not steps:
        raise ValueError("expected at least one verify step, got none")
    count = len(steps)
    avg_nodes = sum(s.tree_nodes + 1 for s in steps) / count
    avg_accepted = sum(s.accepted_drafts for s in steps) / count
    avg_commit = sum(s.committed for s in steps) / count
    return (
        f"{JOURNAL_PREFIX} bs={batch_size} budget={budget} avg_actual_nodes={avg_nodes:.2f} "
        f"avg_accepted_drafts={avg_accepted:.2f} avg_commit_len={avg_commit:.2f} "
        f"avg_accepted_depth={avg_accepted:.2f}"
    )


def render_prometheus(snapshot: MetricsSnapshot, model_name: str) -> str:
    """Prometheus text exposition (version 0.0.4) of `snapshot`, labelled like SGLang's."""
    label = '{{model_name="{}"}}'.format(model_name.replace("\\", "\\\\").replace('"', '\\"'))
    lines: list[str] = []
    for name, field_name, help_text in _COUNTERS:
        lines += [
            f"# HELP {name} {help_text}",
            f"# TYPE {name} counter",
            f"{name}{label} {float(getattr(snapshot, field_name))}",
        ]
    lines += [
        "# HELP sglang:spec_accept_length Lifetime generated tokens per verify call.",
        "# TYPE sglang:spec_accept_length gauge",
        f"sglang:spec_accept_length{label} {snapshot.spec_accept_length}",
    ]
    return "\n".join(lines) + "\n"


def _write_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ServerMetrics:
    """Thread-safe lifetime counters plus the journal line every `log_interval` verify steps."""

    def __init__(
        self,
        budget: int,
        log_interval: int = 32,
        log_sink: Callable[[str], None] = _write_stderr,
    ) -> None:
        if log_interval < 1:
            raise ValueError(f"expected metrics log interval >= 1, got {log_interval}")
        self.budget = budget
        self.log_interval = log_interval
        self._log_sink = log_sink
        self._lock = threading.Lock()
        self._snapshot = MetricsSnapshot()
        self._pending_steps: list[StepStats] = []

    def record(self, result: GenerationResult) -> None:
        """Add one finished request; writes a journal line for each full window of steps."""
        lines: list[str] = []
        with self._lock:
            s = self._snapshot
            self._snapshot = MetricsSnapshot(
                prompt_tokens=s.prompt_tokens + result.prompt_tokens,
                generation_tokens=s.generation_tokens + len(result.token_ids),
                num_requests=s.num_requests + 1,
                spec_verify_calls=s.spec_verify_calls + len(result.steps),
                tree_nodes=s.tree_nodes + sum(st.tree_nodes for st in result.steps),
                accepted_drafts=s.accepted_drafts + sum(st.accepted_drafts for st in result.steps),
            )
            for step in result.steps:
                self._pending_steps.append(step)
                if len(self._pending_steps) == self.log_interval:
                    lines.append(format_journal_line(self._pending_steps, self.budget))
                    self._pending_steps = []
        for line in lines:
            self._log_sink(line)

    def snapshot(self) -> MetricsSnapshot:
        with self._lock:
            return self._snapshot
