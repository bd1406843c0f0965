"""The kernel benchmarks' CUDA-graph timing (conv_verify_kernel.py, gdn_verify_kernel.py).

A graph holds one launch per layer, each layer with its own inputs and buffers as a model's layers have, so a replay
is LAYERS back-to-back launches; the time per launch is the replays' total over replays × launches.
"""

from __future__ import annotations

import torch


def capture(layers, *run_args) -> torch.cuda.CUDAGraph:
    """Every layer's `run(*run_args)` once outside a graph (compile, warm), then once each inside one; replayed once."""
    for layer in layers:
        layer.run(*run_args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for layer in layers:
            layer.run(*run_args)
    graph.replay()
    torch.cuda.synchronize()
    return graph


def time_graph(graph: torch.cuda.CUDAGraph, replays: int, launches: int) -> float:
    """Microseconds per launch over `replays` replays of a graph of `launches` launches (one warm replay first)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / replays / launches
