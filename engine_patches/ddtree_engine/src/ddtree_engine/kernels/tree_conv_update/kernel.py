"""Triton kernel: the tree causal-conv1d update in SGLang's verify layout, its code the same at every width.

SGLang 0.5.23's `_causal_conv1d_update_kernel` (tree path) unrolls `tl.static_range(seqlen)` over one
request's verify rows and, for each row, reduces over all rows to find parents: code and compile time
grow with the square of the rows (93 s at 129 rows, 495 s at 257 compiled for sm_90 on a CPU,
benchmarks/sglang_conv_compile.py), and one compile per request width. This kernel computes the same
arrays (reference.py says which) in one launch of one program per (request, block of channels), with
the rows a runtime argument: one compile serves every width.

1. parents, CHUNK rows at a time: every row's first child gets the row as parent and its next sibling a
   link to the row; then rounds of pointer jumping along the sibling links (r rounds resolve a row up to
   2**r - 1 siblings past its chain's first) give every row its chain's parent. Two scratch rows of the
   program in global memory hold the array, each round reading one and writing the other, a barrier after.
   (Keeping a short request's parents in registers instead, an [R, R] comparison and gathers, was tried and
   timed on an H100 on 2026-12-06: 0.16-0.30 us faster a launch at 16 rows, 1.4-1.6 us slower at 33;
   benchmarks/results/conv_verify_kernel_20261206b_h100.json, the variant in commit 53cd77b.)
2. the rows, BLOCK_R at a time (a runtime loop): each of the K taps is a gather, of x at the ancestor's
   row or of the conv state's column once the walk has left the tree at row 0, so a row costs K
   gathers whatever the tree.
   With the parents given (`parents_given`), the first BLOCK_R rows' parents are read once, at the start, and
   their ancestors walked by `tl.gather` in registers; a later row's ancestor beyond them is read. On an H100
   (2026-12-06, ABA against a dependent load a tap; benchmarks/results/conv_verify_kernel_20261206c_h100_ab.json):
   0.06-0.16 us a launch faster at 16 rows (8.92-10.49 us against 9.03-10.55), 0.02-0.15 us slower at 33.
3. after a barrier, the cache line's state becomes its last K-1 inputs, as in SGLang.

Per tap the product is taken in the inputs' dtype and added to an fp32 sum, in SGLang's order, so
the outputs are SGLang's bit for bit (tests/ddtree_engine/sglang_plugin/test_tree_conv_update.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..gdc import gdc_enter


# The integer arguments that change with the verify width or the batch: not specialised on (Triton otherwise
# compiles a variant for a value of 1 and for multiples of 16), so one compile serves every width.
RUNTIME_ARGS = ("rows", "rounds", "stride_x_seq", "stride_i_line", "stride_nt", "stride_ns", "stride_par", "stride_o_seq")


@triton.jit(do_not_specialize=RUNTIME_ARGS)
def _tree_conv_update_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    state_ptr,
    state_idx_ptr,
    inter_ptr,
    inter_idx_ptr,
    nt_ptr,
    ns_ptr,
    par_ptr,
    scratch_ptr,
    out_ptr,
    rows,
    rounds,
    dim,
    stride_x_seq,
    stride_x_dim,
    stride_x_tok,
    stride_w_dim,
    stride_w_k,
    stride_s_line,
    stride_s_dim,
    stride_s_tok,
    stride_i_line,
    stride_i_step,
    stride_i_dim,
    stride_i_win,
    stride_idx,
    stride_inter_idx,
    stride_nt,
    stride_ns,
    stride_par,
    stride_o_seq,
    stride_o_dim,
    stride_o_tok,
    pad_slot_id,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    HAS_INDICES: tl.constexpr,
    SAVE_INTERMEDIATE: tl.constexpr,
    KP2: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PARENTS_GIVEN: tl.constexpr,
    GDC: tl.constexpr,
):
    gdc_enter(GDC)
    seq = tl.program_id(0)
    block = tl.program_id(1)
    if PARENTS_GIVEN:
        # The first BLOCK_R rows' parents, read once and first (their load overlaps the cache line's): a short
        # request's ancestors are then walked in registers (2. below), not by a dependent load a tap.
        head = tl.arange(0, BLOCK_R)
        head_par = tl.load(par_ptr + seq * stride_par + head, mask=head < rows, other=0).to(tl.int32)
        head_par = tl.minimum(tl.maximum(head_par, 0), rows - 1)
    if HAS_INDICES:
        line = tl.load(state_idx_ptr + seq * stride_idx).to(tl.int64)
        if line == pad_slot_id:
            return
        if SAVE_INTERMEDIATE:
            inter_line = tl.load(inter_idx_ptr + seq * stride_inter_idx).to(tl.int64)
    else:
        line = seq.to(tl.int64)
        inter_line = seq.to(tl.int64)

    # 1. Parents: given (retrieve_parent_token, written by an earlier launch over the same links), or found here,
    # CHUNK rows at a time. Encoding: p >= 0 the parent, -1 nobody's child or sibling (-> 0, as
    # SGLang's initial value), p <= -2 not resolved yet: the same parent as row -2 - p (a previous sibling).
    # Two scratch rows: round i reads one and writes the other, so no row is read after it is rewritten.
    if PARENTS_GIVEN:
        parents = par_ptr + seq * stride_par
    else:
        scratch = scratch_ptr + (seq * tl.num_programs(1) + block) * 2 * rows
        for c0 in range(0, rows, CHUNK):
            r = c0 + tl.arange(0, CHUNK)
            tl.store(scratch + r, tl.full([CHUNK], -1, tl.int32), mask=r < rows)
        tl.debug_barrier()
        for c0 in range(0, rows, CHUNK):
            r = c0 + tl.arange(0, CHUNK)
            in_rows = r < rows
            nt = tl.load(nt_ptr + seq * stride_nt + r, mask=in_rows, other=-1)
            ns = tl.load(ns_ptr + seq * stride_ns + r, mask=in_rows, other=-1)
            tl.store(scratch + nt, r, mask=in_rows & (nt >= 0) & (nt < rows))
            tl.store(scratch + ns, -2 - r, mask=in_rows & (ns >= 0) & (ns < rows))
        tl.debug_barrier()
        for i in range(rounds):
            src = scratch + (i % 2) * rows
            dst = scratch + ((i + 1) % 2) * rows
            for c0 in range(0, rows, CHUNK):
                r = c0 + tl.arange(0, CHUNK)
                in_rows = r < rows
                p = tl.load(src + r, mask=in_rows, other=-1)
                linked = p <= -2
                q = tl.load(src + (-2 - p), mask=in_rows & linked, other=0)
                tl.store(dst + r, tl.where(linked, tl.where(q == -1, 0, q), p), mask=in_rows)
            tl.debug_barrier()
        parents = scratch + (rounds % 2) * rows
        for c0 in range(0, rows, CHUNK):
            r = c0 + tl.arange(0, CHUNK)
            in_rows = r < rows
            p = tl.load(parents + r, mask=in_rows, other=0)
            p = tl.where(p < 0, 0, p)
            tl.store(parents + r, p, mask=in_rows)
            if block == 0:
                tl.store(par_ptr + seq * stride_par + r, p, mask=in_rows)
        tl.debug_barrier()

    # 2. The rows. Tap j of row t is ancestor j of t: v >= 0 a row of x, v < 0 state column K-1+v.
    feats = block * BLOCK_N + tl.arange(0, BLOCK_N)
    fmask = feats < dim
    x_base = x_ptr + seq * stride_x_seq + feats[None, :] * stride_x_dim
    s_base = state_ptr + line * stride_s_line + feats[None, :] * stride_s_dim
    if HAS_BIAS:
        bias = tl.load(b_ptr + feats, mask=fmask, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, rows, BLOCK_R):
        t = start + tl.arange(0, BLOCK_R)
        m = (t < rows)[:, None] & fmask[None, :]
        acc = tl.zeros([BLOCK_R, BLOCK_N], dtype=tl.float32) + bias[None, :]
        v = t
        for j in tl.static_range(K):
            w = tl.load(w_ptr + feats * stride_w_dim + (K - 1 - j) * stride_w_k, mask=fmask, other=0.0)[None, :]
            in_tree = (v >= 0)[:, None]
            xv = tl.load(x_base + tl.maximum(v, 0)[:, None] * stride_x_tok, mask=m & in_tree, other=0.0)
            sv = tl.load(s_base + tl.maximum(K - 1 + v, 0)[:, None] * stride_s_tok, mask=m & ~in_tree, other=0.0)
            tap = tl.where(in_tree, xv, sv)
            acc += tap * w  # SGLang's expression (where the compiler fuses it into an FMA, so does it here)
            if SAVE_INTERMEDIATE:
                if j <= K - 2:
                    tl.store(
                        inter_ptr + inter_line * stride_i_line + t[:, None] * stride_i_step
                        + feats[None, :] * stride_i_dim + (K - 2 - j) * stride_i_win,
                        tap,
                        mask=m,
                    )
            if j < K - 1:
                if PARENTS_GIVEN:
                    # An ancestor among the first BLOCK_R rows from the registers (every one of a request of at most
                    # BLOCK_R rows: no load), a later one read. Given parents are clamped into [0, rows) (found here
                    # they are in it): a bad buffer must not index out of x.
                    near = v < BLOCK_R
                    up = tl.gather(head_par, tl.minimum(tl.maximum(v, 0), BLOCK_R - 1), 0)
                    far = tl.load(parents + tl.maximum(v, 0), mask=(t < rows) & (v > 0) & ~near, other=0).to(tl.int32)
                    up = tl.where(near, up, tl.minimum(tl.maximum(far, 0), rows - 1))
                else:
                    up = tl.load(parents + tl.maximum(v, 0), mask=(t < rows) & (v > 0), other=0).to(tl.int32)
                v = tl.where(v > 0, up, v - 1)
        if SILU:
            acc = acc / (1 + tl.exp(-acc))
        tl.store(out_ptr + seq * stride_o_seq + feats[None, :] * stride_o_dim + t[:, None] * stride_o_tok, acc, mask=m)

    # 3. The line's state: its last K-1 inputs in row order (older state columns where rows < K-1).
    c = tl.arange(0, KP2)
    src = c + rows  # index into [state (K-1 columns), x (rows)]
    keep = (c < K - 1)[:, None] & fmask[None, :]
    from_state = (src < K - 1)[:, None]
    old = tl.load(s_base + tl.minimum(src, K - 2)[:, None] * stride_s_tok, mask=keep & from_state, other=0.0)
    new = tl.load(x_base + tl.maximum(src - (K - 1), 0)[:, None] * stride_x_tok, mask=keep & ~from_state, other=0.0)
    tl.debug_barrier()
    tl.store(s_base + c[:, None] * stride_s_tok, tl.where(from_state, old, new), mask=keep)


def constexprs(width: int, *, has_bias: bool, silu: bool, has_indices: bool, save_intermediate: bool,
               block_r: int = 16, block_n: int = 128, chunk: int = 128, parents_given: bool = False) -> dict:
    """The kernel's compile-time constants for a launch (GDC aside): nothing of the rows or the batch is among them,
    so with RUNTIME_ARGS not specialised on, one compile serves every verify width (benchmarks/sglang_conv_compile.py
    compiles from this)."""
    return dict(K=width, HAS_BIAS=has_bias, SILU=silu, HAS_INDICES=has_indices, SAVE_INTERMEDIATE=save_intermediate,
                KP2=triton.next_power_of_2(width - 1), CHUNK=chunk, BLOCK_R=block_r, BLOCK_N=block_n,
                PARENTS_GIVEN=parents_given)


def tree_conv_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    silu: bool,
    conv_state_indices: torch.Tensor | None,
    intermediate_conv_window: torch.Tensor | None,
    intermediate_state_indices: torch.Tensor | None,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    retrieve_parent_token: torch.Tensor,
    pad_slot_id: int = -1,
    pdl: bool = False,
    block_r: int = 16,
    block_n: int = 128,
    chunk: int = 128,
    parents_given: bool = False,
) -> torch.Tensor:
    """reference.tree_conv_update's arrays in one launch (arguments as there; pdl: launch with PDL).

    parents_given: take every row's parent from `retrieve_parent_token` instead of finding it from the links (which
    are then not read, nor the parents written): for a launch after one that wrote them from the same links, as the
    later Gated-DeltaNet layers of one verify forward (sglang_plugin/tree_conv.py). Saves the parent phase's
    barrier-separated round trips through scratch.
    """
    batch, dim, rows = x.shape
    width = weight.shape[1]
    if not 2 <= width <= 5:
        raise ValueError(f"expected a conv width of 2 to 5, got weight {tuple(weight.shape)}")
    if weight.shape[0] != dim or conv_state.shape[1] != dim or conv_state.shape[2] < width - 1:
        raise ValueError(f"expected weight [{dim}, K] and conv_state [lines, {dim}, >= K-1] for x {tuple(x.shape)}, "
                         f"got {tuple(weight.shape)} and {tuple(conv_state.shape)}")
    if x.dtype != conv_state.dtype:
        raise ValueError(f"expected x and conv_state in one dtype (SGLang's tree conv compiles only so), "
                         f"got {x.dtype} and {conv_state.dtype}")
    for name, links in (("retrieve_next_token", retrieve_next_token), ("retrieve_next_sibling", retrieve_next_sibling),
                        ("retrieve_parent_token", retrieve_parent_token)):
        if links.shape[0] < batch or links.shape[1] < rows or links.stride(-1) != 1:
            raise ValueError(f"expected {name} [>= {batch}, >= {rows}] contiguous along its rows, "
                             f"got {tuple(links.shape)} with strides {links.stride()}")
    out = torch.empty_like(x)
    blocks = triton.cdiv(dim, block_n)
    scratch = torch.empty(1 if parents_given else batch * blocks * 2 * rows, dtype=torch.int32, device=x.device)
    inter = intermediate_conv_window if intermediate_conv_window is not None else x
    inter_strides = intermediate_conv_window.stride() if intermediate_conv_window is not None else (0, 0, 0, 0)
    launch = {"GDC": True, "launch_pdl": True} if pdl else {"GDC": False}
    _tree_conv_update_kernel[(batch, blocks)](
        x,
        weight,
        bias if bias is not None else weight,
        conv_state,
        conv_state_indices if conv_state_indices is not None else out,
        inter,
        intermediate_state_indices if intermediate_state_indices is not None else out,
        retrieve_next_token,
        retrieve_next_sibling,
        retrieve_parent_token,
        scratch,
        out,
        rows,
        # r rounds resolve a row up to 2**r - 1 siblings past its chain's first (at most rows - 2).
        max((rows - 2).bit_length(), 1),
        dim,
        *x.stride(),
        *weight.stride(),
        *conv_state.stride(),
        *inter_strides,
        conv_state_indices.stride(0) if conv_state_indices is not None else 0,
        intermediate_state_indices.stride(0) if intermediate_state_indices is not None else 0,
        retrieve_next_token.stride(0),
        retrieve_next_sibling.stride(0),
        retrieve_parent_token.stride(0),
        *out.stride(),
        pad_slot_id,
        **constexprs(width, has_bias=bias is not None, silu=silu, has_indices=conv_state_indices is not None,
                     save_intermediate=intermediate_conv_window is not None, block_r=block_r, block_n=block_n, chunk=chunk,
                     parents_given=parents_given),
        **launch,
    )
    return out
