"""Issue 10: two ways to shorten what the top-K's merge puts between the first pass and the build, against the step as
TreeStep runs it (first pass, merge, build with compile, walk: four launches, PDL), by budget.

- "merge in build" (and ", rounds"): the merge and the build launches as one (`_merge_rows_build`, defined here),
  no counter, no atomic: its one warp merges all L rows at once as [LP, CP] tiles (the rows' block maxes and sums,
  each row's K best blocks by their first keys, then the K best of those blocks' keys, by `tl.topk` along the rows or
  by K rounds of "max, then drop it"), stores the log-probs and ids and, after a barrier, builds and compiles the tree
  as the build's own launch does on one warp (tree_build `_build`, tree_mask `_compile_chosen`).
- "merge by gather": the merge's own launch (`_merge_gather`, a row a program) loading every block's keys at once
  beside the maxes and sums and taking the chosen blocks' keys from registers (`tl.gather`), instead of a second
  load that waits on the pick of blocks.

Each gives the four launches' arrays (`--smoke`, under TRITON_INTERPRET=1, prints "same"; a wrong block index in
each way turns its arm to MISMATCH). `--ptx` counts each launch's PTX instructions compiled for sm_90 on the CPU
(2026-12-07, Triton 3.9): the merge's program 926 (by gather 2,866), the build with its compile 1,176, and one warp
merging all 15 rows then building 15,246 with `tl.topk`, 8,133 by rounds. So the rows' merges, spread over 15 SMs in
the merge launch, become 6-12 times the build's own code on one warp: likely more time than the launch boundary (~0.9 us
with PDL) they save. Timed on an H100 (2026-12-07 ~14:55 UTC, merge_build_20261207_h100.txt): both slower than the
four launches at every budget (15: 20.58 us, merged in the build 32.96 / 40.00 by rounds, by gather 26.85).
The same logits and arms as bench_tree_step.compare_arms' other scripts; TIMING_ROUNDS interleaved rounds on a GPU.

    PYTHONPATH=engine_patches/ddtree_engine/src python benchmarks/results/merge_build_20261207.py [--smoke | --ptx]
"""
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, as the earlier scripts here
from bench_tree_step import compare_arms  # noqa: E402  (it puts the engine's src on the path)
from ddtree_engine.kernels.gdc import gdc_enter, launch_options  # noqa: E402
from ddtree_engine.kernels.topk_logprobs import kernel as topk_kernel  # noqa: E402
from ddtree_engine.kernels.topk_logprobs.kernel import _SENTINEL, _decoded, _log_total  # noqa: E402
from ddtree_engine.kernels.tree_build import kernel as build_kernel  # noqa: E402
from ddtree_engine.kernels.tree_build.kernel import _build  # noqa: E402
from ddtree_engine.kernels.tree_mask.kernel import _compile_chosen  # noqa: E402
from ddtree_engine.kernels.tree_step import TreeStep  # noqa: E402

SMOKE = "--smoke" in sys.argv
L, V = (3, 3000) if SMOKE else (15, 151_936)
DEV = "cpu" if SMOKE else "cuda"
TIMING_ROUNDS = 1 if SMOKE else 7
BUDGETS = (5, 22) if SMOKE else (15, 22, 32)
BLOCK = {"topk_block": 64} if SMOKE else {}  # small blocks so the smoke's rows take more than KP of them


@triton.jit
def _best_rows(key, KP: tl.constexpr, ROUNDS: tl.constexpr):
    """Each row's KP largest keys of the 2-D `key` (real keys distinct in a row), best first: `tl.topk` along the
    rows, or with ROUNDS KP rounds of "max, then drop it" (topk_logprobs' `_best_keys`, a row at a time)."""
    if ROUNDS:
        slots = tl.arange(0, KP)[None, :]
        out = tl.zeros([key.shape[0], KP], dtype=key.dtype) + _SENTINEL
        for i in tl.static_range(KP):
            b = tl.max(key, axis=1)
            out = tl.where(slots == i, b[:, None], out)
            key = tl.where(key == b[:, None], _SENTINEL, key)
    else:
        out = tl.topk(key, KP)
    return out


@triton.jit
def _merge_rows(keys_ptr, max_ptr, sum_ptr, NCHUNK, vals_ptr, ids_ptr, L, K: tl.constexpr, KP: tl.constexpr,
                CP: tl.constexpr, LP: tl.constexpr, BLOCK: tl.constexpr, ROUNDS: tl.constexpr):
    """`_merge_row` for all L rows at once ([LP, CP] tiles, CP > KP): the same sums, picks and stores."""
    rows = tl.arange(0, LP)
    rmask = rows < L
    chunks = tl.arange(0, CP)
    cmask = rmask[:, None] & (chunks < NCHUNK)[None, :]
    at = rows[:, None] * NCHUNK + chunks[None, :]
    m = tl.load(max_ptr + at, mask=cmask, other=float("-inf"), cache_modifier=".cg")
    s = tl.load(sum_ptr + at, mask=cmask, other=0.0, cache_modifier=".cg")
    heads = tl.load(keys_ptr + at * KP, mask=cmask, other=_SENTINEL, cache_modifier=".cg")
    big = tl.max(m, axis=1)
    big_safe = tl.where(big == float("-inf"), 0.0, big)
    scale = tl.where(m == float("-inf"), 0.0, tl.exp(m - big_safe[:, None])).to(tl.float64)
    total = tl.sum(s * scale, axis=1)
    log_total = _log_total(total)
    top = _best_rows(heads, KP, ROUNDS)  # [LP, KP], each row's best KP heads
    top_chunk = (0x7FFFFFFF - (top & 0xFFFFFFFF)) // BLOCK
    coffs = (rows[:, None, None] * NCHUNK + top_chunk[:, :, None]) * KP + tl.arange(0, KP)[None, None, :]
    key = tl.load(keys_ptr + coffs, mask=(top != _SENTINEL)[:, :, None] & rmask[:, None, None], other=_SENTINEL,
                  cache_modifier=".cg")
    best = _best_rows(tl.reshape(key, [LP, KP * KP]), KP, ROUNDS)
    logprobs, ids = _decoded(best, big_safe.to(tl.float64)[:, None], log_total[:, None])
    slots = tl.arange(0, KP)
    out = rows[:, None] * K + slots[None, :]
    omask = rmask[:, None] & (slots < K)[None, :]
    tl.store(vals_ptr + out, logprobs, mask=omask)
    tl.store(ids_ptr + out, ids, mask=omask)


@triton.jit
def _merge_rows_build(
    keys_ptr, max_ptr, sum_ptr, NCHUNK, vals_ptr, ids_ptr, root_ptr, L, spine, ws_ptr, ws_score_ptr, tok_ptr, par_ptr,
    dep_ptr, rank_ptr, score_ptr, n_ptr, prefix_ptr, mask_ptr, packed_ptr, pos_ptr, fc_ptr, ns_ptr,
    KP: tl.constexpr, CP: tl.constexpr, LP: tl.constexpr, BLOCK: tl.constexpr,
    BUDGET: tl.constexpr, K: tl.constexpr, B: tl.constexpr, NB: tl.constexpr, NP: tl.constexpr, COLS: tl.constexpr,
    SD: tl.constexpr, SR: tl.constexpr, SC: tl.constexpr, KNONE: tl.constexpr, LJ: tl.constexpr, TP: tl.constexpr,
    W: tl.constexpr, ROUNDS: tl.constexpr = False, GDC: tl.constexpr = False,
):
    gdc_enter(GDC)
    _merge_rows(keys_ptr, max_ptr, sum_ptr, NCHUNK, vals_ptr, ids_ptr, L, K, KP, CP, LP, BLOCK, ROUNDS)
    tl.debug_barrier()
    n_chosen, cm, chosen, place, par_place = _build(
        vals_ptr, ids_ptr, root_ptr, L, spine, ws_ptr, ws_score_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr, score_ptr,
        n_ptr, BUDGET, K, B, NB, NP, COLS, SD, SR, SC, KNONE, LJ, TP, True)
    _compile_chosen(n_chosen, cm, place, chosen, prefix_ptr, mask_ptr, packed_ptr, pos_ptr, fc_ptr, ns_ptr, BUDGET + 1,
                    W, NB, NP, LJ)


@triton.jit
def _merge_gather(keys_ptr, max_ptr, sum_ptr, NCHUNK, vals_ptr, ids_ptr, K: tl.constexpr, KP: tl.constexpr,
                  CP: tl.constexpr, BLOCK: tl.constexpr, GDC: tl.constexpr = False):
    """topk_logprobs' `_merge_topk` (a row a program, CP > KP) with every block's keys loaded at once, beside the maxes
    and sums: the K best blocks by their first keys as before, then their keys taken from registers (`tl.gather`)
    instead of a second load that waits on that pick. The same picks, sums and stores."""
    gdc_enter(GDC)
    row = tl.program_id(0)
    chunks = tl.arange(0, CP)
    cmask = chunks < NCHUNK
    m = tl.load(max_ptr + row * NCHUNK + chunks, mask=cmask, other=float("-inf"), cache_modifier=".cg")
    s = tl.load(sum_ptr + row * NCHUNK + chunks, mask=cmask, other=0.0, cache_modifier=".cg")
    slots = tl.arange(0, KP)
    allk = tl.load(keys_ptr + (row * NCHUNK + chunks[:, None]) * KP + slots[None, :], mask=cmask[:, None],
                   other=_SENTINEL, cache_modifier=".cg")  # [CP, KP], each block's keys best first
    big = tl.max(m, axis=0)
    big_safe = tl.where(big == float("-inf"), 0.0, big)
    scale = tl.where(m == float("-inf"), 0.0, tl.exp(m - big_safe)).to(tl.float64)
    total = tl.sum(s * scale, axis=0)
    log_total = _log_total(total)
    top = tl.topk(tl.max(allk, axis=1), KP)  # a block's first key is its largest
    real = top != _SENTINEL
    top_chunk = tl.where(real, (0x7FFFFFFF - (top & 0xFFFFFFFF)) // BLOCK, 0).to(tl.int32)
    key = tl.gather(allk, tl.broadcast_to(top_chunk[:, None], [KP, KP]), 0)
    key = tl.where(real[:, None], key, _SENTINEL)
    best = tl.topk(tl.reshape(key, [KP * KP]), KP)
    logprobs, ids = _decoded(best, big_safe.to(tl.float64), log_total)
    tl.store(vals_ptr + row * K + slots, logprobs, mask=slots < K)
    tl.store(ids_ptr + row * K + slots, ids, mask=slots < K)


def merged_build(rounds: bool):
    """TreeStep.build for a "merge in build" arm: the first pass, then `_merge_rows_build` (its picks by `tl.topk`, or
    by rounds); the serial build on one warp with its compile, the shapes compiles_in_build takes."""

    def build(self, draft_logits, root, prefix_len):
        assert self.compile_in_build and self.k > 0
        consts = topk_kernel.first_pass_constants(self.vocab, self.k, self.topk_block)
        assert consts["CP"] > consts["KP"]
        keys, maxes, sums = topk_kernel.first_pass(draft_logits, self.k, block=self.topk_block, pdl=self.pdl)
        shape = build_kernel.launch_constants(self.budget, self.k, False)
        nb = shape["NB"]
        ws, ws_score = build_kernel.workspaces(self.budget, False, self.device)
        self._keep = (keys, maxes, sums, ws, ws_score)  # alive while a graph replays
        _merge_rows_build[(1,)](
            keys, maxes, sums, keys.shape[1], self.vals, self.ids, root, self.depths,
            min(self.spine_depth, self.depths), ws, ws_score, *self.tree, prefix_len, *self.compiled,
            KP=consts["KP"], CP=consts["CP"], LP=triton.next_power_of_2(self.depths), BLOCK=consts["BLOCK"], **shape,
            LJ=build_kernel.layout_jumps(nb, 1), TP=build_kernel.value_table(self.depths, self.k, 1),
            W=self.compiled[1].shape[1], ROUNDS=rounds, num_warps=1, **launch_options(self.vals, self.pdl))

    return build


ARMS = {"four launches": ({}, BLOCK),
        "merge in build": ({(TreeStep, "build"): merged_build(False)}, BLOCK),
        "merge in build, rounds": ({(TreeStep, "build"): merged_build(True)}, BLOCK),
        "merge by gather": ({(topk_kernel, "_merge_topk"): _merge_gather}, BLOCK)}


def ptx_lines() -> None:
    """PTX instructions (lines that are neither directives, labels nor braces) of each launch at L 15, V 151,936, budget
    15, K 8, compiled for sm_90 on this host (no GPU needed): the merge's one-row program both ways, the build with its
    compile, and this script's kernel both ways (all its rows on one warp)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from ddtree_engine.kernels.tree_build.kernel import _build_compile_tree

    def count(fn, sig, consts, warps):
        src = ASTSource(fn=fn, signature={**sig, **{c: "constexpr" for c in consts}}, constexprs=consts)
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]
        lines = (line.strip() for line in ptx.split("\n"))
        return sum(1 for line in lines if line and not line.startswith(("//", ".", "$", "{", "}")))

    merge = {"keys_ptr": "*i64", "max_ptr": "*fp32", "sum_ptr": "*fp64", "NCHUNK": "i32", "vals_ptr": "*fp64",
             "ids_ptr": "*i64"}
    build = {"vals_ptr": "*fp64", "ids_ptr": "*i64", "root_ptr": "*i64", "L": "i32", "spine": "i32", "ws_ptr": "*i64",
             "ws_score_ptr": "*fp64", "tok_ptr": "*i64", "par_ptr": "*i64", "dep_ptr": "*i64", "rank_ptr": "*i64",
             "score_ptr": "*fp64", "n_ptr": "*i64", "prefix_ptr": "*i64", "mask_ptr": "*i1", "packed_ptr": "*i32",
             "pos_ptr": "*i64", "fc_ptr": "*i64", "ns_ptr": "*i64"}
    both = {**merge, **{n: t for n, t in build.items() if n not in merge}}
    consts = dict(build_kernel.launch_constants(15, 8, False), LJ=build_kernel.layout_jumps(16, 1), GDC=True,
                  TP=build_kernel.value_table(15, 8, 1), W=1)
    print("merge, one row a program (one warp):", count(topk_kernel._merge_topk, merge,
                                                       dict(K=8, KP=8, CP=64, BLOCK=4096, GDC=True), 1))
    print("merge by gather, one row a program (one warp):", count(_merge_gather, merge,
                                                                 dict(K=8, KP=8, CP=64, BLOCK=4096, GDC=True), 1))
    print("build with its compile (one warp):", count(_build_compile_tree, build, consts, 1))
    for rounds in (False, True):
        print(f"merge of every row and build, {'rounds' if rounds else 'tl.topk'} (one warp):",
              count(_merge_rows_build, both, dict(consts, KP=8, CP=64, LP=16, BLOCK=4096, ROUNDS=rounds), 1))


def main():
    if "--ptx" in sys.argv:
        ptx_lines()
        return
    torch.manual_seed(0)
    compare_arms(ARMS, BUDGETS, "four launches", L, V, DEV, TIMING_ROUNDS, capture=not SMOKE, name_width=24)


main()
