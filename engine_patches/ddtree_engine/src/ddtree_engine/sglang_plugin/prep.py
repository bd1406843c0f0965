"""A batch's trees, from the drafter's hidden states to the verify's padded rows, in one replay.

Pure torch and this project's kernels (no sglang), so it is tested on the CPU:
tests/ddtree_engine/sglang_worker/test_prep.py.

Between the drafter's forward and the target's verify, a DDTREE step does on the host what a
DFLASH step does inside its drafter's CUDA graph: the LM head over the drafted depths (one matmul
for the batch), then per request the tree (top-K, build, compile), then the verify's per-row
arrays padded to the graph width. Launched op by op that is ~30 launches per request (4 Triton
kernels, torch allocations, stacks and concatenations) while the GPU waits for the verify;
`TreePrep` captures them once per (batch size, rows) in a CUDA graph and replays it: the host
copies the hidden states, the roots and the prefix lengths into static buffers and launches one
graph. Measured on the H200 (4B-class hybrid, bs 1, 2026-12-01, the per-request form of this
class): DDTREE 15/8 went from 8.92 to 8.16 ms a step (DFLASH 7.21 in that run).

Outputs (static buffers, `rows` = C >= W = the trees' rows, bs requests):
- `tokens`, `depths`, `first_child`, `next_sibling`, `positions`: [bs, C] int64, as
  `padding.pad_tree` gives them (pad rows: the root's token, depth 0, no links) and positions
  prefix + depth;
- `block`: [bs, C, C] bool, the rows' mask among themselves: tree rows see their ancestors, a pad
  row sees itself, nobody sees a pad row (`verify_mask` puts the prefix before it);
- `logits`: [bs, L, V'] the draft logits (a view of the caller's buffer; read by DDTREE_TRACE);
- with `mask_out` (SGLang's flat verify-mask buffer): the verify's custom mask written into it from
  its start (per request [C, prefix + C], the prefix all 1: kernels/tree_mask `flat_verify_mask`,
  reading the prefix lengths on the device), so SGLang's own copy into that buffer before the
  verify is a copy onto itself, which torch skips (worker.py).

Graphs: every capture goes into one memory pool the caller passes (`GraphPool`), so the graphs of
all batch sizes share their temporaries (they replay one after another on one stream; what must
outlive a replay is a static buffer or a tensor the class holds), and a failed capture leaves the
class eager for good with a warning instead of stopping the server (SGLang's own captures while
serving do the same). DDTREE_TREE_GRAPH=0 runs the same ops eagerly, here and in walk_commit.py
(a measurement switch; the server's own --disable-cuda-graph does too).
"""

from __future__ import annotations

import logging
import os
from typing import Callable

import torch

from ..kernels.tree_mask import flat_verify_mask
from ..kernels.tree_step import TreeStep
from .padding import flat_custom_mask

GRAPH_ENV = "DDTREE_TREE_GRAPH"
logger = logging.getLogger(__name__)


def env_switch(name: str, default: bool) -> bool:
    """An on/off environment switch: it leaves its default only for an explicit word (1/true/yes/on
    turns a switch that is off by default on, 0/false/no/off turns one that is on by default off)."""
    value = os.environ.get(name, "").strip().lower()
    return value not in ("0", "false", "no", "off") if default else value in ("1", "true", "yes", "on")


def graphs_wanted(device: torch.device, disable_cuda_graph: bool) -> bool:
    """Whether the tree step on `device` replays CUDA graphs (CUDA, graphs on, not switched off)."""
    if device.type != "cuda" or disable_cuda_graph:
        return False
    return env_switch(GRAPH_ENV, default=True)


# DDTREE_DRAFT_GRAPH_AT_BLOCK (on by default; 0 turns it off): for budgets wider than the drafter's block,
# the worker captures the drafter's graphs at the block (worker.DDTreeWorker.init_cuda_graphs) instead of
# running it eager. On the H200 (2026-12-01): lossless against AR with the eager drafter's verify steps
# (lab pair 32/8, 20/8, the drafter replayed on every step), 4B-class 31/8 step 1.30x -> 1.18x DFLASH.
DRAFT_GRAPH_ENV = "DDTREE_DRAFT_GRAPH_AT_BLOCK"


def draft_graph_at_block() -> bool:
    """Whether the drafter's graphs are captured at its block when the verify is wider (on unless
    DDTREE_DRAFT_GRAPH_AT_BLOCK switches it off)."""
    return env_switch(DRAFT_GRAPH_ENV, default=True)


class GraphPool:
    """One CUDA-graph memory pool for every capture of a worker, made on first use."""

    def __init__(self):
        self._handle = None

    def handle(self):
        if self._handle is None:
            self._handle = torch.cuda.graph_pool_handle()
        return self._handle


class Graphed:
    """Run `ops` eagerly, or capture it once (after a warm-up) and replay it.

    Args:
        ops: the callable to run; it reads and writes only tensors that outlive the call.
        device: its CUDA device, when `graph`.
        graph: capture and replay (else eager every time).
        pool: the GraphPool the capture allocates from (None: a private pool).
        what: named in the warning if the capture fails.
    """

    def __init__(self, ops: Callable[[], None], device: torch.device, graph: bool, pool: GraphPool | None, what: str):
        self.ops, self.device, self.graph_wanted, self.pool, self.what = ops, torch.device(device), graph, pool, what
        self.graph: torch.cuda.CUDAGraph | None = None
        self.warming = False  # True while `ops` runs as the warm-up before a capture (its work is redone)

    def __call__(self) -> None:
        if not self.graph_wanted:
            self.ops()
            return
        if self.graph is None:
            try:
                self._capture()
            except Exception as exc:  # noqa: BLE001 - any capture failure: stay eager, keep serving
                logger.warning("DDTREE: capturing %s in a CUDA graph failed (%s); it runs op by op from now on", self.what, exc)
                self.graph_wanted, self.graph = False, None
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                self.ops()
                return
        self.graph.replay()

    def _capture(self) -> None:
        # Warm up on a side stream (Triton compiles, cuBLAS picks its kernels), then capture; the
        # caller's replay right after gives this step's result (a capture executes nothing).
        # thread_local: CUDA calls of the server's other host threads do not break the capture.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.warming = True
            try:
                self.ops()
            finally:
                self.warming = False
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        pool = self.pool.handle() if self.pool is not None else None
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            self.ops()
        self.graph = graph


class TreePrep:
    """Static buffers and the (optionally graphed) ops of a batch's tree step.

    Args:
        steps: the requests' TreeSteps, in batch order (each's `num_rows` is W).
        lm_weight: [V', H] the target's LM head (V' >= vocab, padded vocabularies allowed).
        vocab: V, the logits' columns the trees read.
        rows: C, the verify's rows per request (W <= C).
        logits: [>= bs, L, V'] a buffer in the head's dtype for the draft logits, and
        hidden: [>= bs, L, H] one for the drafter's hidden states (both shared by the preps of all
            batch sizes: they run one after another).
        graph: capture a CUDA graph on the first call and replay it after.
        pool: the GraphPool captures allocate from.
        mask_out: a flat bool/uint8 buffer the verify's custom mask is written into (cells past its
            end are not written: the caller checks the size), or None.
    """

    def __init__(self, steps: list[TreeStep], lm_weight: torch.Tensor, vocab: int, rows: int, logits: torch.Tensor,
                 hidden: torch.Tensor, graph: bool = False, pool: GraphPool | None = None,
                 mask_out: torch.Tensor | None = None):
        bs, width, depths = len(steps), steps[0].num_rows, steps[0].depths
        if rows < width:
            raise ValueError(f"expected rows >= the trees' width {width}, got {rows}")
        if logits.shape[0] < bs or tuple(logits.shape[1:]) != (depths, lm_weight.shape[0]) or logits.dtype != lm_weight.dtype:
            raise ValueError(f"expected a logits buffer [>= {bs}, {depths}, {lm_weight.shape[0]}] {lm_weight.dtype}, "
                             f"got {tuple(logits.shape)} {logits.dtype}")
        if hidden.shape[0] < bs or tuple(hidden.shape[1:]) != (depths, lm_weight.shape[1]) or hidden.dtype != lm_weight.dtype:
            raise ValueError(f"expected a hidden-state buffer [>= {bs}, {depths}, {lm_weight.shape[1]}] {lm_weight.dtype}, "
                             f"got {tuple(hidden.shape)} {hidden.dtype}")
        device = steps[0].device
        self.steps, self.weight, self.vocab, self.rows, self.width = steps, lm_weight, vocab, rows, width
        long = dict(dtype=torch.int64, device=device)
        self.hidden = hidden[:bs]
        self.root = torch.zeros(bs, 1, **long)
        self.prefix = torch.zeros(bs, 1, **long)
        self.logits = logits[:bs]
        self.tokens = torch.zeros(bs, rows, **long)
        self.depths = torch.zeros(bs, rows, **long)  # pad rows stay at depth 0
        self.first_child = torch.full((bs, rows), -1, **long)  # pad rows stay without links
        self.next_sibling = torch.full((bs, rows), -1, **long)
        self.positions = torch.zeros(bs, rows, **long)
        self.block = torch.zeros(bs, rows, rows, dtype=torch.bool, device=device)
        pad = torch.arange(width, rows, device=device)
        self.block[:, pad, pad] = True  # a pad row sees itself (and the prefix); the tree part is copied in
        self.mask_out = mask_out
        self._run = Graphed(self._ops, device, graph, pool, f"the tree step (bs {bs}, {rows} rows)")

    def _ops(self) -> None:
        w, steps = self.width, self.steps
        torch.matmul(self.hidden, self.weight.T, out=self.logits)
        for i, step in enumerate(steps):
            step.build(self.logits[i, :, : self.vocab], self.root[i], self.prefix[i])
        self.tokens[:, :w].copy_(torch.stack([s.tree[0] for s in steps]))
        self.tokens[:, w:].copy_(self.root.expand(-1, self.rows - w))
        self.depths[:, :w].copy_(torch.stack([s.tree[2] for s in steps]))
        self.first_child[:, :w].copy_(torch.stack([s.compiled[3] for s in steps]))
        self.next_sibling[:, :w].copy_(torch.stack([s.compiled[4] for s in steps]))
        self.positions[:, :w].copy_(torch.stack([s.compiled[2] for s in steps]))
        self.positions[:, w:].copy_(self.prefix.expand(-1, self.rows - w))
        self.block[:, :w, :w].copy_(torch.stack([s.compiled[0] for s in steps]))
        if self.mask_out is not None:
            flat_verify_mask(self.block, self.prefix, self.mask_out)

    def run(self, hidden: torch.Tensor, roots: torch.Tensor, prefix_lens: torch.Tensor) -> None:
        """Fill the outputs for this step.

        Args:
            hidden: [bs, L, H] the drafter's hidden states at depths 1..L.
            roots: [bs] the root (bonus) tokens; prefix_lens: [bs] their positions. Any integer dtype.
        """
        self.hidden.copy_(hidden)
        self.root.copy_(roots.view(-1, 1))
        self.prefix.copy_(prefix_lens.view(-1, 1))
        self._run()


def same_buffer(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether two optional tensors are the same memory (address, size, dtype), or both None."""
    if a is None or b is None:
        return a is b
    return (a.data_ptr(), a.numel(), a.dtype) == (b.data_ptr(), b.numel(), b.dtype)


def verify_mask(prep: TreePrep, prefix_lens: list[int]) -> torch.Tensor:
    """SGLang's flat TARGET_VERIFY custom mask from the prep's blocks (padding.flat_custom_mask)."""
    return flat_custom_mask(list(prep.block), prefix_lens)


def sglang_mask_buffer(vm, bs: int) -> torch.Tensor | None:
    """The flat buffer of SGLang's VerifyMask `vm` (the target attention backend's `verify_mask`:
    the triton backend's is allocated with its CUDA graphs, uint8, read as [C, prefix + C] per
    request) for a batch of `bs`, or None when there is none, it reads another layout (QLEN_ONLY,
    not read) or was sized for fewer requests."""
    if vm is None or not vm.is_read or getattr(vm.mode, "name", "") != "FULL_MASK" or not vm.fits(bs):
        return None
    buffer = vm.buffer
    return buffer if buffer.dim() == 1 and buffer.dtype in (torch.uint8, torch.bool) and buffer.is_contiguous() else None


def step_custom_mask(prep: TreePrep, prefix_lens: list[int]) -> torch.Tensor:
    """This step's flat custom mask for SGLang's verify: the cells the prep wrote into SGLang's
    buffer (a view of its start: SGLang's copy into the buffer is then a copy onto itself, which
    torch skips) when they all fit, else the mask built from the prep's blocks."""
    cells = prep.rows * (sum(prefix_lens) + len(prefix_lens) * prep.rows)
    if prep.mask_out is not None and cells <= prep.mask_out.numel():
        return prep.mask_out[:cells]
    return verify_mask(prep, prefix_lens)


@torch.no_grad()  # the worker's constructor runs outside SGLang's no-grad forward (an out= matmul refuses grad)
def warm_up(step: TreeStep, lm_weight: torch.Tensor, vocab: int) -> None:
    """Run one request's tree step once on zero hidden states, eagerly, so Triton compiles its kernels for this
    shape and the head's dtype when the worker starts, not in the first request: on the H200 (2026-12-05, SGLang
    at budget 128) the threshold build compiled for 50 s inside the first request. The LM head, top-K, build,
    compile, walk and the flat verify mask (into a uint8 buffer, as SGLang's Triton backend holds it) at the
    tree's own width; a verify padded wider compiles the mask kernel again, and walk + commit's torch ops need no
    compile. Writes only `step`'s own buffers (the worker's slot 0, rebuilt every step) and temporaries (the draft
    logits, [L, V'] in the head's dtype: 4.6 MB at V' 151,936 bf16), which SGLang's memory measurement after it
    empties the cache does not count.

    Args:
        step: the TreeStep to run (its shape is the server's); lm_weight: [V', H] the target's LM head;
            vocab: V, the columns the tree reads.
    """
    device, depths, rows = step.device, step.depths, step.num_rows
    logits = torch.empty(1, depths, lm_weight.shape[0], dtype=lm_weight.dtype, device=device)
    hidden = torch.zeros(1, depths, lm_weight.shape[1], dtype=lm_weight.dtype, device=device)
    mask = torch.zeros(rows * rows, dtype=torch.uint8, device=device)  # prefix 0: [C, 0 + C]
    prep = TreePrep([step], lm_weight, vocab, rows, logits, hidden, mask_out=mask)
    zero = torch.zeros(1, dtype=torch.int64, device=device)
    prep.run(hidden, zero, zero)
    step.walk(torch.zeros(rows, dtype=torch.int64, device=device))
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TreePreps:
    """The worker's TreePreps, one per (batch size, rows), over shared buffers and one graph pool.

    A batch larger than any before gets larger draft-logits and hidden-state buffers, and every
    prep (whose graph holds the old ones) is made again; so is every prep after the LM head's
    storage moved (a weight update): a graph would replay the old address.

    Args:
        step_for_slot: the TreeStep of request slot i (the same object every call).
        depths, vocab: L and V of the trees.
        device: where the buffers live.
        graph: whether the preps capture CUDA graphs; pool: the GraphPool they share.
    """

    def __init__(self, step_for_slot: Callable[[int], TreeStep], depths: int, vocab: int, device,
                 graph: bool = False, pool: GraphPool | None = None):
        self.step_for_slot, self.depths, self.vocab, self.device = step_for_slot, depths, vocab, torch.device(device)
        self.graph, self.pool = graph, pool
        self.preps: dict[tuple[int, int], TreePrep] = {}
        self.logits: torch.Tensor | None = None
        self.hidden: torch.Tensor | None = None
        self.weight_ptr: int | None = None  # the LM head's storage the preps' graphs read
        self.mask_out: torch.Tensor | None = None  # the verify-mask buffer the preps write

    def get(self, bs: int, rows: int, lm_weight: torch.Tensor, mask_out: torch.Tensor | None = None) -> TreePrep:
        """The prep of `bs` requests at `rows` rows with this LM head, writing the verify mask into
        `mask_out` (or None: SGLang's buffer does not fit this batch), made on first use; every prep
        is made again when `mask_out` is another buffer than before (SGLang swapped it), but not for
        batch sizes that alternate between the buffer and None."""
        have = 0 if self.logits is None else self.logits.shape[0]
        if have < bs or self.weight_ptr != lm_weight.data_ptr():
            size = max(bs, have)
            self.weight_ptr = lm_weight.data_ptr()
            self.logits = torch.empty(size, self.depths, lm_weight.shape[0], dtype=lm_weight.dtype, device=self.device)
            self.hidden = torch.zeros(size, self.depths, lm_weight.shape[1], dtype=lm_weight.dtype, device=self.device)
            self.preps.clear()
        if mask_out is not None:
            if self.mask_out is not None and not same_buffer(self.mask_out, mask_out):
                self.preps.clear()  # SGLang swapped its buffer: graphs write the old one (and keep it alive)
            self.mask_out = mask_out
        prep = self.preps.get((bs, rows))
        if prep is not None and not same_buffer(prep.mask_out, mask_out):
            prep = None  # (a batch size's buffer, or none, stays the same while SGLang keeps its buffer)
        if prep is None:
            steps = [self.step_for_slot(i) for i in range(bs)]
            prep = TreePrep(steps, lm_weight, self.vocab, rows, self.logits, self.hidden, graph=self.graph, pool=self.pool,
                            mask_out=mask_out)
            self.preps[(bs, rows)] = prep
        return prep
