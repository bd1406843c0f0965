"""A DDTree step (kernels/tree_step.TreeStep) captured in a CUDA graph, for the GPU tests that replay it."""

from __future__ import annotations

import torch


def capture_step(step, logits: torch.Tensor, root: torch.Tensor, prefix: torch.Tensor, choices: torch.Tensor) -> torch.cuda.CUDAGraph:
    """`step.build` + `step.walk` on these static inputs, run once on a side stream (Triton compiles there,
    off the capture) and then captured; replaying the graph reads whatever the inputs hold by then."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step.build(logits, root, prefix)
        step.walk(choices)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step.build(logits, root, prefix)
        step.walk(choices)
    return graph
