"""Triton kernels: parent-indexed causal conv1d, gated delta rule over a tree, and the commit.

Three launches per Gated-DeltaNet layer and step, none of them per tree level:

- `tree_causal_conv`: one program per (block of nodes, block of channels); every node's K-tap window is read
  through its row of `window_index` [T, K] (core.hybrid.conv_window_index), so the conv has no
  order dependence at all and a tree costs what a chain costs.
- `gated_delta_tree`: one program per (value head, value block) walks all T nodes in index
  order (parents precede children). The state block [Dk, BV] of the node just processed stays
  in registers; node t continues from it when its parent is t-1 (every node of a chain, every
  first child that follows its parent), reloads the committed state when its parent is -1, and
  otherwise reloads its parent's state from the per-node state buffer [T, H, Dk, Dv] that the
  same program wrote earlier (an L2 hit). Every node's state is written because any node can
  turn out to be the last accepted one; a DFlash chain verify keeps one state per position for
  the same reason, so a tree pays only the parent reloads over a chain. Node t+1's inputs are
  loaded before node t's update so their latency hides behind the serial recurrence. A chain
  (parents None) runs a specialisation without parent reads; a linear forward (prefill, or a
  chain committed whole) writes only the last state.
- `commit_gdn_state`: one launch gathers the accepted node's state [H, Dk, Dv] and its conv
  window [K-1, C] into the cache slot; the node index is read on the device, so the commit
  needs no host synchronisation.

Accumulation is in the state dtype (fp32, or fp64 for the CPU tests' fp64 models); the conv
accumulates in fp32 (fp64 for fp64 inputs) and rounds once at the end.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_FLOAT_STATES = (torch.float32, torch.float64)


@triton.jit
def _tree_conv_kernel(
    x_ptr,
    win_ptr,
    w_ptr,
    b_ptr,
    idx_ptr,
    out_ptr,
    T,
    C,
    stride_x,
    stride_win,
    stride_w,
    stride_idx,
    stride_out,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    CHAIN: tl.constexpr,
    FP64: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    rmask = rows < T
    cmask = cols < C
    m = rmask[:, None] & cmask[None, :]
    acc_dtype = tl.float64 if FP64 else tl.float32
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=acc_dtype)
    for j in tl.static_range(K):
        # src indexes cat(committed_window [K-1], x [T]); a chain's window is the K rows ending at t.
        if CHAIN:
            src = rows + j
        else:
            src = tl.load(idx_ptr + rows * stride_idx + j, mask=rmask, other=0)
        in_window = (src < K - 1)[:, None]
        xw = tl.load(win_ptr + src[:, None] * stride_win + cols[None, :], mask=m & in_window, other=0.0)
        x_row = tl.maximum(src - (K - 1), 0)
        xs = tl.load(x_ptr + x_row[:, None] * stride_x + cols[None, :], mask=m & (src >= K - 1)[:, None], other=0.0)
        w = tl.load(w_ptr + cols * stride_w + j, mask=cmask, other=0.0).to(acc_dtype)
        acc += (xw.to(acc_dtype) + xs.to(acc_dtype)) * w[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cmask, other=0.0).to(acc_dtype)[None, :]
    out = acc / (1.0 + tl.exp(-acc))  # SiLU
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _gated_delta_tree_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    parents_ptr,
    s0_ptr,
    out_ptr,
    states_ptr,
    T,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_gt,
    stride_bt,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    KEEP_STATES: tl.constexpr,
    CHAIN: tl.constexpr,
):
    h = tl.program_id(0)
    hk = h // GROUP  # repeat_interleave's head map: value head h reads key head h // (H / Hk)
    rk = tl.arange(0, BK)
    rv = tl.program_id(1) * BV + tl.arange(0, BV)
    mk = rk < DK
    mv = rv < DV
    m2 = mk[:, None] & mv[None, :]
    acc_dtype = s0_ptr.dtype.element_ty
    # This program's [Dk, BV] tile of head h inside a [H, Dk, Dv] state (contiguous).
    tile = h * DK * DV + rk[:, None] * DV + rv[None, :]
    node_state = tl.num_programs(0) * DK * DV  # H * Dk * Dv: one node's slot in `states`
    q_base = q_ptr + hk * stride_qh + rk
    k_base = k_ptr + hk * stride_kh + rk
    v_base = v_ptr + h * stride_vh + rv
    # Output and state pointers advance every node (pointer arithmetic is 64-bit).
    out_ptrs = out_ptr + h * stride_oh + rv
    slot_ptrs = states_ptr + tile
    if CHAIN:
        s = tl.load(s0_ptr + tile, mask=m2, other=0.0).to(acc_dtype)
    else:
        s = tl.zeros([BK, BV], dtype=acc_dtype)
    # Node 0's inputs. In the loop node t+1's are loaded before node t's update, so their memory
    # latency hides behind it (the recurrence itself is the serial part).
    q_next = tl.load(q_base, mask=mk, other=0.0)
    k_next = tl.load(k_base, mask=mk, other=0.0)
    v_next = tl.load(v_base, mask=mv, other=0.0)
    g_next = tl.load(g_ptr + h)
    beta_next = tl.load(beta_ptr + h)
    if not CHAIN:
        zero_tile = tl.zeros([BK, BV], dtype=tl.int32)
        p_next = tl.load(parents_ptr)
    for t in range(T):
        q = q_next.to(acc_dtype)
        k = k_next.to(acc_dtype)
        v = v_next.to(acc_dtype)
        decay = tl.exp(g_next.to(acc_dtype))
        beta = beta_next.to(acc_dtype)
        nxt = tl.minimum(t + 1, T - 1)  # the last node reloads itself: no out-of-bounds read
        q_next = tl.load(q_base + nxt * stride_qt, mask=mk, other=0.0)
        k_next = tl.load(k_base + nxt * stride_kt, mask=mk, other=0.0)
        v_next = tl.load(v_base + nxt * stride_vt, mask=mv, other=0.0)
        g_next = tl.load(g_ptr + nxt * stride_gt + h)
        beta_next = tl.load(beta_ptr + nxt * stride_bt + h)
        if not CHAIN:
            p = p_next
            p_next = tl.load(parents_ptr + nxt)
            # Registers hold node t-1's state; any other parent is reloaded: predicated loads
            # (no traffic when off) and a select, which beat a branch on the H200 (and so did
            # this on-demand reload beat prefetching the parent's state one node ahead, which
            # costs a second register tile). The conditions are block-shaped: Triton's
            # interpreter turns `block & scalar` into int32.
            p_tile = zero_tile + p
            s_init = tl.load(s0_ptr + tile, mask=m2 & (p_tile < 0), other=0.0).to(acc_dtype)
            s_slot = tl.load(
                states_ptr + tl.maximum(p, 0).to(tl.int64) * node_state + tile,
                mask=m2 & (p_tile >= 0) & (p_tile != t - 1),
                other=0.0,
            )
            s = tl.where(p_tile < 0, s_init, tl.where(p_tile == t - 1, s, s_slot))
        s = s * decay
        kv_mem = tl.sum(s * k[:, None], axis=0)  # [BV]
        delta = (v - kv_mem) * beta
        s = s + k[:, None] * delta[None, :]
        o = tl.sum(s * q[:, None], axis=0)
        tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=mv)
        if KEEP_STATES:
            tl.store(slot_ptrs, s, mask=m2)
            if not CHAIN:
                # A later child of this node may reload the slot: make the writes visible to all threads.
                tl.debug_barrier()
            slot_ptrs += node_state
        out_ptrs += stride_ot
    if not KEEP_STATES:
        tl.store(states_ptr + tile, s, mask=m2)


@triton.jit
def _commit_kernel(
    states_ptr,
    node_ptr,
    state_out_ptr,
    x_ptr,
    win_ptr,
    idx_ptr,
    win_out_ptr,
    STATE_NUMEL,
    C,
    stride_x,
    stride_win,
    stride_idx,
    stride_win_out,
    STATE_PROGRAMS,
    K: tl.constexpr,
    KP: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    node = tl.load(node_ptr).to(tl.int64)
    # Names differ between the branches: Triton types a name across both sides of an `if`.
    if pid < STATE_PROGRAMS:
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        in_state = offs < STATE_NUMEL
        state = tl.load(states_ptr + node * STATE_NUMEL + offs, mask=in_state)
        tl.store(state_out_ptr + offs, state, mask=in_state)
    else:
        cols = (pid - STATE_PROGRAMS) * BLOCK_C + tl.arange(0, BLOCK_C)
        cmask = cols < C
        rows = tl.arange(0, KP)
        rmask = rows < K - 1
        # Window row r of the accepted node is column r + 1 of its window index (oldest first).
        src = tl.load(idx_ptr + node * stride_idx + 1 + rows, mask=rmask, other=0)
        in_window = src < K - 1
        m = rmask[:, None] & cmask[None, :]
        # Both loads complete before the store: the window may be updated in place.
        xw = tl.load(win_ptr + src[:, None] * stride_win + cols[None, :], mask=m & in_window[:, None], other=0.0)
        xs = tl.load(
            x_ptr + tl.maximum(src - (K - 1), 0)[:, None] * stride_x + cols[None, :],
            mask=m & (src >= K - 1)[:, None],
            other=0.0,
        )
        out_dtype = win_out_ptr.dtype.element_ty
        val = tl.where(in_window[:, None], xw.to(out_dtype), xs.to(out_dtype))
        tl.store(win_out_ptr + rows[:, None] * stride_win_out + cols[None, :], val, mask=m)


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def tree_causal_conv(
    x: torch.Tensor,
    committed_window: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    window_index: torch.Tensor | None,
    *,
    block_c: int = 256,
) -> torch.Tensor:
    """Depthwise causal conv along each node's ancestor path, then SiLU (one launch).

    Args:
        x: [T, C] conv inputs of the nodes (model dtype).
        committed_window: [K-1, C] the last K-1 committed inputs, oldest first.
        weight: [C, K] depthwise kernel (weight[:, K-1] multiplies the newest input).
        bias: [C] or None.
        window_index: [T, K] integer indices into cat(committed_window, x), from
            core.hybrid.conv_window_index; None for a chain (node t's window is rows t..t+K-1).
        block_c: channels per program (a power of two); each program takes up to 16 nodes.

    Returns:
        [T, C] activations in x's dtype.
    """
    _check(x.dim() == 2, f"expected x [T, C], got {tuple(x.shape)}")
    t, c = x.shape
    _check(weight.dim() == 2 and weight.shape[0] == c, f"expected weight [{c}, K], got {tuple(weight.shape)}")
    kernel_size = weight.shape[1]
    _check(
        tuple(committed_window.shape) == (kernel_size - 1, c),
        f"expected committed_window [{kernel_size - 1}, {c}], got {tuple(committed_window.shape)}",
    )
    _check(bias is None or tuple(bias.shape) == (c,), f"expected bias [{c}], got {None if bias is None else tuple(bias.shape)}")
    if window_index is not None:
        _check(
            tuple(window_index.shape) == (t, kernel_size) and not window_index.dtype.is_floating_point,
            f"expected integer window_index [{t}, {kernel_size}], got {window_index.dtype} {tuple(window_index.shape)}",
        )
    _check(block_c & (block_c - 1) == 0, f"expected block_c a power of two, got {block_c}")
    x = _rows_contiguous(x)
    committed_window = _rows_contiguous(committed_window)
    weight = weight.contiguous()
    out = torch.empty_like(x)
    if t == 0:
        return out
    idx = window_index if window_index is not None else x.new_zeros((1, 1), dtype=torch.int32)
    block_t = min(triton.next_power_of_2(t), 16)
    block_c = min(block_c, triton.next_power_of_2(c))
    _tree_conv_kernel[(triton.cdiv(t, block_t), triton.cdiv(c, block_c))](
        x,
        committed_window,
        weight,
        bias if bias is not None else weight,
        idx,
        out,
        t,
        c,
        x.stride(0),
        committed_window.stride(0),
        weight.stride(0),
        idx.stride(0),
        out.stride(0),
        K=kernel_size,
        HAS_BIAS=bias is not None,
        CHAIN=window_index is None,
        FP64=x.dtype == torch.float64,
        BLOCK_T=block_t,
        BLOCK_C=block_c,
    )
    return out


def gated_delta_tree(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor | None,
    initial_state: torch.Tensor,
    keep_states: bool,
    *,
    block_v: int | None = None,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule along tree paths, all nodes in one launch.

    Args:
        query, key: [T, Hk, Dk] (already L2-normalised; query already scaled by Dk**-0.5);
            Hk divides H, value head h reads key head h // (H / Hk) (repeat_interleave's map).
        value: [T, H, Dv]. g (log decay), beta: [T, H]. Any float dtypes.
        parents: [T] integer tensor on the device, -1 = start from `initial_state`, every
            parent before its child; None for a chain (parents [-1, 0, 1, ...]).
        initial_state: [H, Dk, Dv] fp32 or fp64, the accumulation dtype.
        keep_states: keep every node's state (tree verify); else only the last node's, and
            the nodes must be a chain (`parents` is then ignored).
        block_v: value columns per program (a power of two); default min(Dv, 16).
        num_warps: Triton warps per program; default 2.

    Returns:
        (out [T, H, Dv], states [T, H, Dk, Dv] if keep_states else [1, H, Dk, Dv] of node T-1),
        both in initial_state's dtype.
    """
    _check(query.dim() == 3, f"expected query [T, Hk, Dk], got {tuple(query.shape)}")
    t, hk, dk = query.shape
    _check(tuple(key.shape) == (t, hk, dk), f"expected key {(t, hk, dk)}, got {tuple(key.shape)}")
    _check(value.dim() == 3 and value.shape[0] == t, f"expected value [{t}, H, Dv], got {tuple(value.shape)}")
    h, dv = value.shape[1], value.shape[2]
    _check(h % hk == 0, f"expected key heads dividing value heads, got {hk} key heads and {h} value heads")
    _check(tuple(g.shape) == (t, h), f"expected g [{t}, {h}], got {tuple(g.shape)}")
    _check(tuple(beta.shape) == (t, h), f"expected beta [{t}, {h}], got {tuple(beta.shape)}")
    _check(
        tuple(initial_state.shape) == (h, dk, dv),
        f"expected initial_state [{h}, {dk}, {dv}], got {tuple(initial_state.shape)}",
    )
    _check(initial_state.dtype in _FLOAT_STATES, f"expected an fp32 or fp64 state, got {initial_state.dtype}")
    if parents is not None:
        _check(
            tuple(parents.shape) == (t,) and not parents.dtype.is_floating_point,
            f"expected integer parents [{t}], got {parents.dtype} {tuple(parents.shape)}",
        )
    # H200, Qwen3.5-27B heads (48 x 128 x 128), 16 nodes: 16 columns on 2 warps ran fastest for
    # both the tree and the chain (benchmarks/bench_gdn_tree.py sweeps these).
    block_v = block_v or min(triton.next_power_of_2(dv), 16)
    _check(block_v & (block_v - 1) == 0, f"expected block_v a power of two, got {block_v}")
    sd = initial_state.dtype
    query, key, value = _rows_contiguous(query), _rows_contiguous(key), _rows_contiguous(value)
    g, beta = _rows_contiguous(g), _rows_contiguous(beta)
    initial_state = initial_state.contiguous()
    out = torch.empty((t, h, dv), dtype=sd, device=value.device)
    states = torch.empty((t if keep_states else 1, h, dk, dv), dtype=sd, device=value.device)
    if t == 0:
        return out, (states if keep_states else initial_state.unsqueeze(0).clone())
    chain = parents is None or not keep_states
    par = parents if not chain else initial_state.new_zeros((1,), dtype=torch.int32)
    _gated_delta_tree_kernel[(h, triton.cdiv(dv, block_v))](
        query,
        key,
        value,
        g,
        beta,
        par,
        initial_state,
        out,
        states,
        t,
        query.stride(0),
        query.stride(1),
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        g.stride(0),
        beta.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=h // hk,
        DK=dk,
        DV=dv,
        BK=triton.next_power_of_2(dk),
        BV=block_v,
        KEEP_STATES=keep_states,
        CHAIN=chain,
        num_warps=num_warps or 2,
    )
    return out, states


def commit_gdn_state(
    states: torch.Tensor,
    node: torch.Tensor | int,
    state_out: torch.Tensor,
    conv_input: torch.Tensor,
    window_index: torch.Tensor,
    window: torch.Tensor,
    *,
    block: int = 4096,
    block_c: int = 1024,
) -> None:
    """Write the accepted node's recurrent state and conv window into the cache slot (one launch).

    Args:
        states: [T, H, Dk, Dv] per-node states of the verify forward (contiguous).
        node: the last accepted node, an int or a one-element integer tensor on the device
            (read by the kernel: no host synchronisation).
        state_out: [H, Dk, Dv] the cache's state slot, overwritten (contiguous, states' dtype).
        conv_input: [T, C] the nodes' conv inputs.
        window_index: [T, K] the verify forward's window index.
        window: [K-1, C] the cache's committed window: read, then overwritten in place with
            the newest K-1 inputs of the accepted node's path.
    """
    _check(states.dim() == 4, f"expected states [T, H, Dk, Dv], got {tuple(states.shape)}")
    _check(
        tuple(state_out.shape) == tuple(states.shape[1:]) and state_out.dtype == states.dtype,
        f"expected state_out {states.dtype} {tuple(states.shape[1:])}, got {state_out.dtype} {tuple(state_out.shape)}",
    )
    _check(states.is_contiguous() and state_out.is_contiguous(), "expected contiguous states and state_out")
    _check(window.dim() == 2, f"expected window [K-1, C], got {tuple(window.shape)}")
    kernel_size, c = window.shape[0] + 1, window.shape[1]
    t = conv_input.shape[0]
    _check(tuple(conv_input.shape) == (t, c), f"expected conv_input [T, {c}], got {tuple(conv_input.shape)}")
    _check(
        tuple(window_index.shape) == (t, kernel_size) and not window_index.dtype.is_floating_point,
        f"expected integer window_index [{t}, {kernel_size}], got {window_index.dtype} {tuple(window_index.shape)}",
    )
    _check(window.stride(-1) == 1, "expected a window with contiguous rows")
    if not isinstance(node, torch.Tensor):
        node = torch.tensor([node], dtype=torch.int64, device=states.device)
    _check(node.numel() == 1 and not node.dtype.is_floating_point, f"expected one integer node, got {node.dtype} {tuple(node.shape)}")  # no value: that would sync
    conv_input = _rows_contiguous(conv_input)
    window_index = window_index.contiguous()
    numel = state_out.numel()
    state_programs = triton.cdiv(numel, block)
    block_c = min(block_c, triton.next_power_of_2(c))
    window_programs = triton.cdiv(c, block_c) if kernel_size > 1 else 0
    _commit_kernel[(state_programs + window_programs,)](
        states,
        node.reshape(1),
        state_out,
        conv_input,
        window,
        window_index,
        window,
        numel,
        c,
        conv_input.stride(0),
        window.stride(0),
        window_index.stride(0),
        window.stride(0),
        state_programs,
        K=kernel_size,
        KP=triton.next_power_of_2(max(kernel_size - 1, 1)),
        BLOCK=block,
        BLOCK_C=block_c,
    )
