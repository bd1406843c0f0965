"""One request's tree, from the drafter's hidden states to the verify's padded rows, in one replay.

Pure torch and this project's kernels (no sglang), so it is tested on the CPU:
tests/ddtree_engine/sglang_worker/test_prep.py.

Between the drafter's forward and the target's verify, a DDTREE step does on the host what a
DFLASH step does inside its drafter's CUDA graph: the LM head over the drafted depths, then the
tree (top-K, build, compile), then the verify's per-row arrays padded to the graph width. Launched
op by op that is ~30 launches (4 Triton kernels, torch allocations, stacks and concatenations)
while the GPU waits for the verify; `TreePrep` captures them once per request slot in a CUDA graph
and replays it: the host copies the hidden states, the root and the prefix length into static
buffers and launches one graph.

Outputs (static buffers, `rows` = C >= W = the tree's rows):
- `tokens`, `depths`, `first_child`, `next_sibling`, `positions`: [C] int64, as `padding.pad_tree`
  gives them (pad rows: the root's token, depth 0, no links) and positions prefix + depth;
- `block`: [C, C] bool, the rows' mask among themselves: tree rows see their ancestors, a pad row
  sees itself, nobody sees a pad row (`padding.tree_custom_mask` puts the prefix before it);
- `logits`: [L, V] the draft logits (read by DDTREE_TRACE).

DDTREE_TREE_GRAPH=0 runs the same ops eagerly, here and in walk_commit.py (a measurement switch;
the server's own --disable-cuda-graph does too). Measured on the H200 (4B-class hybrid, bs 1,
2026-12-01): the graph took DDTREE 15/8 from 8.92 to 8.16 ms a step (DFLASH 7.21 in that run).
"""

from __future__ import annotations

import os

import torch

from ..kernels.tree_step import TreeStep

GRAPH_ENV = "DDTREE_TREE_GRAPH"


def graphs_wanted(device: torch.device, disable_cuda_graph: bool) -> bool:
    """Whether a TreePrep on `device` replays a CUDA graph (CUDA, graphs on, not switched off)."""
    if device.type != "cuda" or disable_cuda_graph:
        return False
    return os.environ.get(GRAPH_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class TreePrep:
    """Static buffers and the (optionally graphed) ops of one request slot's tree step.

    Args:
        step: the slot's TreeStep (its `num_rows` is W).
        lm_weight: [V', H] the target's LM head (V' >= vocab, padded vocabularies allowed).
        vocab: V, the logits' columns the tree reads.
        rows: C, the verify's rows per request (W <= C).
        graph: capture a CUDA graph on the first call and replay it after.
    """

    def __init__(self, step: TreeStep, lm_weight: torch.Tensor, vocab: int, rows: int, graph: bool = False):
        width = step.num_rows
        if rows < width:
            raise ValueError(f"expected rows >= the tree's width {width}, got {rows}")
        device = step.device
        self.step, self.weight, self.vocab, self.rows, self.width = step, lm_weight, vocab, rows, width
        self.graph_wanted = graph
        self._graph: torch.cuda.CUDAGraph | None = None
        long = dict(dtype=torch.int64, device=device)
        self.hidden = torch.zeros(step.depths, lm_weight.shape[1], dtype=lm_weight.dtype, device=device)
        self.root = torch.zeros(1, **long)
        self.prefix = torch.zeros(1, **long)
        self.tokens = torch.zeros(rows, **long)
        self.depths = torch.zeros(rows, **long)  # pad rows stay at depth 0
        self.first_child = torch.full((rows,), -1, **long)  # pad rows stay without links
        self.next_sibling = torch.full((rows,), -1, **long)
        self.positions = torch.zeros(rows, **long)
        self.block = torch.zeros(rows, rows, dtype=torch.bool, device=device)
        pad = torch.arange(width, rows, device=device)
        self.block[pad, pad] = True  # a pad row sees itself (and the prefix); the tree part is copied in
        self.logits: torch.Tensor | None = None

    def _ops(self) -> None:
        w = self.width
        logits = torch.matmul(self.hidden, self.weight.T)[:, : self.vocab]
        self.logits = logits
        step = self.step
        step.build(logits, self.root, self.prefix)
        tokens, _, depths, _, _, _ = step.tree
        mask, _, positions, first_child, next_sibling = step.compiled
        self.tokens[:w].copy_(tokens)
        self.tokens[w:].copy_(self.root.expand(self.rows - w))
        self.depths[:w].copy_(depths)
        self.first_child[:w].copy_(first_child)
        self.next_sibling[:w].copy_(next_sibling)
        self.positions[:w].copy_(positions)
        self.positions[w:].copy_(self.prefix.expand(self.rows - w))
        self.block[:w, :w].copy_(mask)

    def run(self, hidden: torch.Tensor, root: torch.Tensor, prefix_len: torch.Tensor) -> None:
        """Fill the outputs for this step.

        Args:
            hidden: [L, H] the drafter's hidden states at depths 1..L.
            root: [1] the root (bonus) token; prefix_len: [1] its position. Any integer dtype.
        """
        self.hidden.copy_(hidden)
        self.root.copy_(root)
        self.prefix.copy_(prefix_len)
        if not self.graph_wanted:
            self._ops()
            return
        if self._graph is None:
            self._capture()
        self._graph.replay()

    def _capture(self) -> None:
        # Warm up on a side stream (Triton compiles, cuBLAS picks its kernels), then capture. The
        # buffers already hold this step's inputs, so the capture's own run is this step's result.
        # thread_local: CUDA calls of other host threads of the server do not break the capture.
        side = torch.cuda.Stream(self.hidden.device)
        side.wait_stream(torch.cuda.current_stream(self.hidden.device))
        with torch.cuda.stream(side):
            self._ops()
        torch.cuda.current_stream(self.hidden.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self._ops()
        self._graph = graph


def verify_mask(preps: list[TreePrep], prefix_lens: list[int]) -> torch.Tensor:
    """SGLang's flat TARGET_VERIFY custom mask: per request [C, prefix + C], the prefix all True.

    The same layout as `padding.tree_custom_mask`, from the preps' `block`s.
    """
    parts = []
    for prep, prefix in zip(preps, prefix_lens):
        seen = torch.ones((prep.rows, prefix), dtype=torch.bool, device=prep.block.device)
        parts.append(torch.cat([seen, prep.block], dim=1).reshape(-1))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def stacked(preps: list[TreePrep], name: str) -> torch.Tensor:
    """[bs, C] of one output across the batch (a view, no copy, for one request)."""
    if len(preps) == 1:
        return getattr(preps[0], name).unsqueeze(0)
    return torch.stack([getattr(p, name) for p in preps])
