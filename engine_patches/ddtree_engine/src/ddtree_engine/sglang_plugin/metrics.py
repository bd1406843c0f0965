"""The DDTREE worker's running step metrics, summed on the device and read only when logged.

Pure torch (no sglang): tests/ddtree_engine/sglang_worker/test_metrics.py. A CUDA-graph step is a
few milliseconds; reading the commit lengths back every step (`int(commit_lens.sum())`) would
stall the host on the device once per step. The sum stays a device tensor; the host reads it
once per `every` steps, when the log line is due. The worker's walk + commit adds each step's
commit lengths to `total` inside its CUDA graph (walk_commit.py), so counting a step costs the
host no launch.
"""

from __future__ import annotations

import torch


class StepMetrics:
    """Running means for the `DDTREE metrics:` log line.

    Args:
        budget: the drafted nodes requested per step (shown in the line).
        nodes: the tree nodes verified per request and step.
        every: log every this many steps.
        device: where `total` (the running sum of commit lengths) lives.
    """

    def __init__(self, budget: int, nodes: int, every: int = 64, device: torch.device | str = "cpu"):
        self.budget, self.nodes, self.every = budget, nodes, every
        self.steps = 0
        self.requests = 0  # sum of bs over steps (host)
        self.graph_steps = 0  # steps whose target verify replayed a CUDA graph (host)
        self.draft_graph_steps = 0  # steps whose drafter replayed a CUDA graph (host)
        self.total = torch.zeros(1, dtype=torch.int64, device=device)  # sum of commit lengths (device)

    def add(self, bs: int, graph: bool = False, draft_graph: bool = False) -> str | None:
        """Count one step whose commit lengths are already in `total` (the walk + commit adds them);
        return the log line when one is due (the only host read), else None.

        Args:
            bs: requests in the step.
            graph: the target's verify replayed a CUDA graph (SGLang's `can_run_cuda_graph`).
            draft_graph: the drafter's forward replayed a CUDA graph (its `can_run_graph`).
        """
        self.steps += 1
        self.requests += bs
        self.graph_steps += bool(graph)
        self.draft_graph_steps += bool(draft_graph)
        if self.steps % self.every:
            return None
        return self.line()

    def line(self) -> str:
        """The log line from the sums so far (reads the device sum: one host sync)."""
        n = max(self.requests, 1)
        commit = int(self.total)
        accepted = commit - self.requests  # the bonus token is not a draft
        return (
            f"DDTREE metrics: bs={self.requests / max(self.steps, 1):.2f} budget={self.budget} "
            f"avg_actual_nodes={self.nodes:.2f} avg_accepted_drafts={accepted / n:.3f} "
            f"avg_commit_len={commit / n:.3f} avg_accepted_depth={accepted / n:.3f} "
            f"cuda_graph_steps={self.graph_steps}/{self.steps} draft_cuda_graph_steps={self.draft_graph_steps}/{self.steps}"
        )
