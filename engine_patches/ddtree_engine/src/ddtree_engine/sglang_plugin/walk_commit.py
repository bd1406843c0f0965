"""The walk and the KV-window commit of a verified batch of trees, replayed as one CUDA graph.

Pure torch and this project's kernels (no sglang), so it is tested on the CPU:
tests/ddtree_engine/sglang_worker/test_walk_commit.py.

After the target's verify, a DDTREE step walks every tree with the target's choices and permutes
each request's KV window so the accepted nodes come first (commit.py). Op by op that is ~40 small
launches per step, and on a small model the host launching them is the step's critical path (the
lab pair on the H200, 2026-12-01: DDTREE 15/8 4.2 ms/step against DFLASH's 2.9). `WalkCommit`
captures them once per (batch size, rows) and replays them: the target's argmax writes the choices
into a static buffer (`choice`, with `out=`), the host copies the prefix lengths, request slots and
KV locations into others and launches one graph.

Outputs (tensors that keep their storage across replays): `path`, `emitted` [bs, W] int64;
`commit_lens` [bs] int32; `bonus` [bs] int64; `new_seq_lens` [bs] (the prefix lengths' dtype);
`order` [bs, W] int64 (commit.window_order); `cols` [bs, W] int64 (window positions);
`out_tokens` [bs, W] int64 (accepted tokens, then 0); `last_row` [bs] int64 (the row whose hybrid
state is committed); `ctx_locs` [bs, W] int64 (the drafter's KV slots in path order). Side effects:
`req_to_token[req, prefix + j]` holds the window's slots in committed order; `total` (when given)
grows by the step's accepted tokens + bonuses, summed on the device (metrics.StepMetrics).

A replay overwrites the outputs of the one before, and the outputs live in the graph pool the
worker's other graphs share: an earlier capture's temporaries may lie under them, so the next
replay of that graph (the next step's tree step) would overwrite them too. What a step hands on is
copied out before any other replay (worker.py). (An attempt on 2026-12-02 to hand them on from two
alternating instances instead crashed the 4B-class target on the H200 for exactly that reason.)
"""

from __future__ import annotations

import torch

from ..kernels.tree_step import TreeStep
from .commit import last_accepted_row, window_order
from .prep import GraphPool, Graphed


class WalkCommit:
    """Static inputs and the (optionally graphed) walk + commit of `len(steps)` requests.

    Args:
        steps: the requests' TreeSteps, in batch order (built this step; their `walked` buffers
            are written).
        rows: C, the verify's rows per request (>= W, the trees' rows).
        req_to_token: SGLang's [slots, max_len] request-to-KV-slot table (written in place).
        seq_dtype: the dtype of the batch's prefix lengths.
        graph: capture a CUDA graph on the first call and replay it after (prep.Graphed: a failed
            capture leaves it eager).
        pool: the GraphPool captures allocate from (shared with the tree step's).
        total: a [1] int64 device tensor the step's commit lengths are added to (once per step: not
            in the warm-up before a capture), or None.
    """

    def __init__(self, steps: list[TreeStep], rows: int, req_to_token: torch.Tensor, seq_dtype: torch.dtype,
                 graph: bool = False, pool: GraphPool | None = None, total: torch.Tensor | None = None):
        bs, width = len(steps), steps[0].num_rows
        if rows < width:
            raise ValueError(f"expected rows >= the trees' width {width}, got {rows}")
        device = steps[0].device
        self.steps, self.rows, self.width, self.req_to_token = steps, rows, width, req_to_token
        long = dict(dtype=torch.int64, device=device)
        self.choice = torch.zeros(bs, width, **long)
        self.prefix = torch.zeros(bs, dtype=seq_dtype, device=device)
        self.req = torch.zeros(bs, **long)
        self.locs = torch.zeros(bs, rows, **long)
        self.write_ids = torch.zeros(bs, rows, **long)
        self.idx = torch.arange(width, **long)
        self.total = total
        self._run = Graphed(self._ops, device, graph, pool, f"the walk and commit (bs {bs}, {rows} rows)")

    def _ops(self) -> None:
        steps, width = self.steps, self.width
        for i, step in enumerate(steps):
            step.walk(self.choice[i])
        self.path = torch.stack([s.walked[0] for s in steps])  # [bs, W] node ids, then -1
        self.emitted = torch.stack([s.walked[1] for s in steps])  # accepted tokens + bonus, then -1
        self.commit_lens = torch.cat([s.walked[2] for s in steps]).to(torch.int32)
        self.bonus = torch.cat([s.walked[3] for s in steps])
        self.new_seq_lens = self.prefix + self.commit_lens.to(self.prefix.dtype)
        accepted = self.idx.unsqueeze(0) < self.commit_lens.unsqueeze(1).to(torch.int64)
        # The window's slots, reordered: accepted nodes first (in path order), then the rest (their
        # KV is dead; the slots stay reserved for this request). Pad rows' slots stay in place.
        self.order = window_order(self.path, self.commit_lens)
        new_window = torch.gather(self.locs[:, :width], 1, self.order)
        self.cols = self.prefix.to(torch.int64).unsqueeze(1) + self.idx
        self.req_to_token[self.req.unsqueeze(1), self.cols] = new_window.to(self.req_to_token.dtype)
        self.last_row = last_accepted_row(self.path, self.commit_lens)
        self.out_tokens = torch.where(accepted, self.emitted, 0)
        self.ctx_locs = torch.gather(self.write_ids, 1, self.order)
        if self.total is not None and not self._run.warming:
            self.total.add_(self.commit_lens.sum(dtype=torch.int64))

    def run(self, prefix_lens: torch.Tensor, req_pool_indices: torch.Tensor, verify_locs: torch.Tensor,
            write_ids: torch.Tensor) -> None:
        """Walk and commit this step, with the target's choices per tree row already in `self.choice`
        [bs, W] (the worker's argmax writes them there: `torch.argmax(..., out=post.choice)`).

        Args:
            prefix_lens: [bs] the committed lengths before this step.
            req_pool_indices: [bs] the requests' rows of req_to_token.
            verify_locs: [bs * C] the KV slots the verify wrote, row j of request i at i * C + j.
            write_ids: [bs * C] the drafter's KV slots for the same rows.
        """
        self.prefix.copy_(prefix_lens)
        self.req.copy_(req_pool_indices)
        self.locs.copy_(verify_locs.view(self.locs.shape))
        self.write_ids.copy_(write_ids.view(self.write_ids.shape))
        # The warm-up before a capture writes req_to_token too: the same window, from the same inputs.
        self._run()

