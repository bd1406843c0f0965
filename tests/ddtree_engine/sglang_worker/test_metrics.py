"""The worker's step metrics read the device only when the log line is due (CPU, no sglang)."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from ddtree_engine.sglang_plugin.metrics import StepMetrics

# Tensor -> host reads: each one waits for the device.
HOST_READS = {"item", "tolist", "__int__", "__float__", "__bool__", "__index__", "cpu", "numpy"}


class HostReads(TorchFunctionMode):
    """Records every tensor-to-host read made inside the block."""

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS or (name == "to" and any(str(a) == "cpu" for a in args[1:])):
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


def one_step(metrics, bs, commit_lens, **kw):
    """One step as the worker's: the walk + commit adds the commit lengths to `total` on the device, then add()."""
    metrics.total.add_(torch.tensor(commit_lens, dtype=torch.int32).sum(dtype=torch.int64))
    return metrics.add(bs, **kw)


def test_steps_between_log_lines_do_not_read_the_device():
    metrics = StepMetrics(budget=15, nodes=15, every=4)
    lines = []
    with HostReads() as seen:
        for step in range(3):
            lines.append(one_step(metrics, 2, [3, 1]))
    assert lines == [None, None, None]
    assert seen.reads == []


def test_the_due_step_reads_once_and_logs_the_running_means():
    metrics = StepMetrics(budget=8, nodes=8, every=4)
    commits = [[3, 1], [2, 2], [5, 1], [1, 1]]  # 16 tokens over 8 request-steps
    for i, c in enumerate(commits[:-1]):
        assert one_step(metrics, 2, c, graph=i > 0, draft_graph=i == 1) is None
    with HostReads() as seen:
        line = one_step(metrics, 2, commits[-1], graph=True)
    assert len(seen.reads) == 1
    assert line == (
        "DDTREE metrics: bs=2.00 budget=8 avg_actual_nodes=8.00 avg_accepted_drafts=1.000 "
        "avg_commit_len=2.000 avg_accepted_depth=1.000 cuda_graph_steps=3/4 draft_cuda_graph_steps=1/4"
    )
    # The next window keeps the totals running, as the worker's log always did.
    for _ in range(4):
        line = one_step(metrics, 1, [4])
    assert "bs=1.50" in line and "avg_commit_len=2.667" in line  # (16 + 16) / 12
