"""Triton kernel: top-K, tree build and compile of one DDTree step in one launch.

`TreeStep(fused=True)` runs its `build` as this one kernel instead of four (top-K's two passes,
the build, the compile): in a CUDA graph every launch costs its start and drain, ~7 us of the
38 us budget-15 step with the walk (profile below).

Grid (L rows, ceil(V / BLOCK) blocks), as top-K's first pass. Each program does its block
(topk_logprobs `_chunk_keys`), then counts itself done on its row's counter (an acq_rel atomic
after a barrier: its stores are visible to whoever counts after it); the program that finishes
a row last merges it (`_merge_row`, loads that bypass L1), then counts the row done; the program
that finishes the last row builds the tree (tree_build's `_build_tree` or `_build_tree_levels`)
and compiles it (tree_mask's `_compile_rows`, block by block). Each last program puts its counter
back to 0, so the next launch (a graph replay) starts from zeros. Nobody waits on anybody: the
programs that are not last just end. Under TRITON_INTERPRET=1 the programs run one after another,
so the last of each row is its last block and the same code paths run.

Measured on the H200 (benchmarks/bench_tree_step.py, 2026-12-02 21:52 run, L 15, V 151,936 bf16, topk 8,
the whole step with the walk in a CUDA graph): budget 15 28.4 us against 29.4 for the four launches
(1.03x; 1.06x at 16:37, before the top-K's group stage), budget 22 33.4 against 32.7; from budget 64 it
is slower (95.6 against 50.8 us; 473 against 154 at 256): the last program compiles the tree block after
block where the compile kernel runs its blocks side by side, and builds with this kernel's 4 warps. In a
profile of the budget-15 step (21:37 run) the four kernels take 8.6 (top-K blocks) + 3.3 (merge) + 5.5
(build) + 3.0 (compile) us and the fused one 19.6, so what it saves is launch gaps. Opt-in
(`TreeStep(fused=True)`), not the default: the gain is ~1 us of a ~6 ms verify step. On one warp
(`TreeStep(fused=True, topk_warps=1)`) the last program builds as the serial build's own launch does up to budget 32:
values, chosen nodes and the compile from registers (`CIB`; tree_build.kernel.compiles_in_build).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..gdc import gdc_enter, launch_options
from ..topk_logprobs import kernel as topk_kernel
from ..topk_logprobs.kernel import _chunk_keys, _merge_row
from ..tree_build import kernel as build_kernel
from ..tree_build.kernel import _build, _build_tree
from ..tree_build.levels import _build_tree_levels
from ..tree_mask import kernel as mask_kernel
from ..tree_mask.kernel import _compile_chosen, _compile_rows


# Rows the last program compiles at a time (it runs the compile's blocks one after another, so it
# takes larger blocks than the compile kernel's own programs, which run side by side).
FUSED_COMPILE_ROWS = 16


@triton.jit
def _fused_build(
    logits_ptr, stride_row, V, NCHUNK, keys_ptr, max_ptr, sum_ptr, count_ptr, vals_ptr, ids_ptr,
    root_ptr, L, spine, ws_ptr, ws_score_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr, score_ptr, n_ptr,
    prefix_ptr, max_depth, mask_ptr, packed_ptr, pos_ptr, fc_ptr, ns_ptr, N, W,
    K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr, GROUP: tl.constexpr, CP: tl.constexpr,
    BUDGET: tl.constexpr, B: tl.constexpr, NB: tl.constexpr, NP: tl.constexpr, COLS: tl.constexpr,
    LEVELS: tl.constexpr, LOGB: tl.constexpr, BR: tl.constexpr, WP: tl.constexpr,
    SD: tl.constexpr, SR: tl.constexpr, SC: tl.constexpr, KNONE: tl.constexpr, LOWBITS: tl.constexpr = 0,
    ROUNDS: tl.constexpr = False, GDC: tl.constexpr = False, LJ: tl.constexpr = 0, TP: tl.constexpr = 0,
    CIB: tl.constexpr = False, WC: tl.constexpr = 1,
):
    gdc_enter(GDC)
    row = tl.program_id(0)
    _chunk_keys(logits_ptr, stride_row, V, NCHUNK, keys_ptr, max_ptr, sum_ptr, row, tl.program_id(1), K, KP, BLOCK, GROUP,
                LOWBITS, ROUNDS)
    tl.debug_barrier()
    blocks_done = tl.atomic_add(count_ptr + row, 1, sem="acq_rel")
    if blocks_done == NCHUNK - 1:
        tl.store(count_ptr + row, 0)
        _merge_row(keys_ptr, max_ptr, sum_ptr, NCHUNK, vals_ptr, ids_ptr, row, K, KP, CP, BLOCK)
        tl.debug_barrier()
        rows_done = tl.atomic_add(count_ptr + L, 1, sem="acq_rel")
        if rows_done == L - 1:
            tl.store(count_ptr + L, 0)
            if CIB:  # one warp: the serial build with its values, chosen nodes and compile in registers
                n_chosen, cm, chosen, place, par_place = _build(
                    vals_ptr, ids_ptr, root_ptr, L, spine, ws_ptr, ws_score_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr,
                    score_ptr, n_ptr, BUDGET, K, B, NB, NP, COLS, SD, SR, SC, KNONE, LJ, TP, True)
                _compile_chosen(n_chosen, cm, place, chosen, prefix_ptr, mask_ptr, packed_ptr, pos_ptr, fc_ptr, ns_ptr,
                                BUDGET + 1, WC, NB, NP, LJ)
            elif LEVELS:
                _build_tree_levels(vals_ptr, ids_ptr, root_ptr, L, ws_ptr, ws_score_ptr, tok_ptr, par_ptr, dep_ptr,
                                   rank_ptr, score_ptr, n_ptr, BUDGET, K, KP, B, NB, NP, COLS, LOGB)
            else:
                _build_tree(vals_ptr, ids_ptr, root_ptr, L, spine, ws_ptr, ws_score_ptr, tok_ptr, par_ptr, dep_ptr,
                            rank_ptr, score_ptr, n_ptr, BUDGET, K, B, NB, NP, COLS, SD, SR, SC, KNONE)
            if not CIB:
                tl.debug_barrier()
                for row0 in range(0, N, BR):
                    _compile_rows(row0, par_ptr, dep_ptr, n_ptr, prefix_ptr, max_depth, mask_ptr, packed_ptr, pos_ptr,
                                  fc_ptr, ns_ptr, N, W, BR, NP, WP)


class FusedBuild:
    """The workspaces of one step shape and the launch of `_fused_build` into a TreeStep's buffers.

    Args:
        step: the TreeStep (its L, V, budget, K, spine, build method and output buffers).
        block: tokens per program of the top-K pass (a power of two); group: its group stage's tokens
            per group (topk_logprobs.kernel.topk_logprobs).
        num_warps: warps of every program (the last one builds and compiles with the same warps).
        pdl: launch with programmatic dependent launch (kernels/gdc.py; None: DDTREE_PDL, else gdc.DEFAULT).
        rounds: the top-K pass selects by K rounds (topk_logprobs.kernel.topk_logprobs).
    """

    def __init__(self, step, block: int = 4096, group: int = topk_kernel.DEFAULT_GROUP, num_warps: int = 4,
                 pdl: bool | None = None, rounds: bool = False):
        self.step, self.num_warps, self.rounds = step, num_warps, rounds
        self.gdc = launch_options(step.vals, pdl)
        depths, budget, device = step.depths, step.budget, step.device
        topk_consts = topk_kernel.first_pass_constants(step.vocab, step.k, block, group)
        self.nchunk = triton.cdiv(step.vocab, topk_consts["BLOCK"])
        self.keys, self.maxes, self.sums = topk_kernel.first_pass_buffers(depths, self.nchunk, topk_consts["KP"], device)
        # Zero once; every launch leaves them at zero again.
        self.counts = torch.zeros(depths + 1, dtype=torch.int32, device=device)
        self.levels = step.build_method == "levels" and step.spine_depth == 0
        self.spine = min(step.spine_depth, depths, budget)
        self.ws, self.ws_score = build_kernel.workspaces(budget, self.levels, device)
        self.n_out = budget + 1
        # The three kernels' constexprs (KP and NP, named by two of them, are the same values) and
        # both selections' (the kernel names them all; LEVELS picks one).
        self.shape = {**topk_consts, **build_kernel.launch_constants(budget, step.k, True),
                      **build_kernel.key_constants(budget, step.k),
                      **mask_kernel.launch_constants(self.n_out, FUSED_COMPILE_ROWS), "LEVELS": self.levels}
        # On one warp the serial build takes its values, chosen nodes and compile in registers, as its own launch does
        # (tree_build.kernel.compiles_in_build).
        if (num_warps == 1 and not self.levels and build_kernel.COMPILE_IN_BUILD
                and build_kernel.compiles_in_build(budget, step.k, "serial")):
            nb = self.shape["NB"]
            self.shape.update(CIB=True, LJ=build_kernel.layout_jumps(nb, 1),
                              TP=build_kernel.value_table(depths, step.k, 1), WC=step.compiled[1].shape[1])

    def __call__(self, draft_logits: torch.Tensor, root: torch.Tensor, prefix_len: torch.Tensor) -> None:
        step = self.step
        topk_kernel._check(draft_logits, step.k)
        draft_logits = topk_kernel.rows_contiguous(draft_logits)
        _fused_build[(step.depths, self.nchunk)](
            draft_logits, draft_logits.stride(0), step.vocab, self.nchunk, self.keys, self.maxes, self.sums, self.counts,
            step.vals, step.ids, root, step.depths, self.spine, self.ws, self.ws_score, *step.tree,
            prefix_len, step.depths, *step.compiled, self.n_out, step.compiled[1].shape[1],
            **self.shape, LOWBITS=topk_kernel.key_low_bits(draft_logits.dtype, self.shape["BLOCK"]), ROUNDS=self.rounds,
            num_warps=self.num_warps,
            **self.gdc,
        )
