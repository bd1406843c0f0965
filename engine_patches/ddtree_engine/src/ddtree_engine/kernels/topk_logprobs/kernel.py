"""Triton kernel: per-row log-softmax and top-K over [L, V] logits in one pass, no sort.

Two launches, both over fixed shapes (`topk_logprobs`):

- `_chunk_topk`: a grid of (L rows, ceil(V / BLOCK) blocks), BLOCK = 4096 tokens (38 programs per
  row at V = 151,936); each program reads its block once (bf16, fp16 or fp32, widened to fp32)
  and writes the block's max, its sum of exp(x - max) (fp64), and its K best tokens as 64-bit
  keys. A key is the logit's bits mapped to an order-preserving integer in the high half and
  (2^31 - 1 - token id) in the low half, so one integer max picks the largest logit and, among
  equal logits, the lowest id: the reference's stable-sort ties. A group stage first (`_chunk_keys`,
  GROUP = 8): the block's groups of 8 tokens ranked by their best key, the K best of the BLOCK / 8 group
  keys, then the K best of the 8 tokens of each of the K groups chosen (the K best tokens lie in them).
  Each selection is Triton's bitonic top-k (`tl.topk`, in `_top_keys`). On bf16 and fp16 logits the
  selections rank 32-bit keys instead (`key_low_bits`, `_keys32`): a widened bf16 logit has 16 zero low bits
  (fp16 13), which hold the token's offset in its block, so the value's order-preserving high bits and the offset
  make one int32 whose max is the same token; the K best are widened to the 64-bit keys at the store, the same
  keys as before (`KEYS32 = False` restores the 64-bit ones). On an H100 (2026-12-05 14:41; no H200 would start) a
  launch in a CUDA graph takes 6.53 us against 8.60 with 64-bit keys, and the budget-15 step 26.6 against 28.4 (README,
  Triton kernels). A program is 1,128 sm_90 instructions with 32-bit keys against 1,512 (SHFL 139 against 255; Triton
  3.9's SASS for [15, 151,936] bf16, 4096 / 8 / 4 warps, 64 registers) as a launch compiles it: V, the row stride and
  the pointers divisible by 16, so a thread loads its group's 8 tokens in one 128-bit load. The counts this note gave
  before 2026-12-07 (3,536 against 5,384, "issue-bound") were of a compile without that specialisation (33 one-token
  loads a thread). On an H100 (2026-12-07, Triton 3.6, the launched kernel: 1,304 instructions, 56 registers) a launch
  in a CUDA graph of 20 takes 3.37 us over 1 row and 6.44 over 15: half fixed (a launch and one program's chain), half
  the 570 programs' issue (benchmarks/results/firstpass_latency_20261207.py, `_counts.txt`, `_h100.txt`).
- `_merge_topk`: one program per row merges the blocks: logsumexp = M + log(sum_c s_c *
  exp(m_c - M)), and the K best of the blocks' keys, decoded back to (logit, id): the K best blocks by
  their first key, then the K best of those blocks' keys. Log-probs are written in fp64 as
  (x - M) - log(S), so equal logits in a row give bit-equal log-probs.

Measured on the H200 (benchmarks/bench_tree_step.py, [15, 151,936] bf16, K = 8, 2026-12-02 21:37): the
pass in a CUDA graph 17.6 us with the group stage against 26.2 without it (1.48x, same run; the
first pass alone 8.6 against 16.2 us in a profile); groups of 16 or 32 tokens 17.8-17.9, of 4 18.7. A split
variant (S programs per row, each looping over tiles, keeping its K best online) took 48.8-54.6 us
at S = 16/32/64 (2026-12-01) and was removed.
The selections were K rounds of "max, then drop it" (`_best_keys`, kept for K = 1, for fewer than KP keys
and for more than 1,024), each round a block-wide reduction and a barrier. With `tl.topk` instead, and the
merge over the K best blocks only (H200 2026-12-03 ~17:45, benchmarks/results/topk_selection_20261203.{py,txt},
same ids and log-probs as the rounds on the logits timed; per launch in a CUDA graph of 20): the first pass
8.1 against 8.9 us (2048-token blocks 8.0 against 11.7), the merge 2.6 against 3.3 us with one warp (3.1
against 3.6 with four; one is now the default), both 10.7 against 12.7 us; the pass in a graph of its own
(bench_tree_step.py) 15.5 us, 0.97x the graphed argmax. Tried and slower: supergroups of 64 tokens before the
groups (a third selection; first pass 11.2 us, an earlier run that afternoon), all-pairs ranks of 64 keys (a [64, 64] int64
comparison: 255 registers and spills with Triton 3.6, 58.8 us, an earlier run), and `tl.topk` over the
4,096 keys of a block without groups (above).

Precision: the exponentials and the final log are fp32, the sums fp64, so log-probs agree with
the float64 reference to about 1e-7; ids agree exactly (distinct fp32 logits give distinct float64
log-probs in the same order).

Non-finite logits (a drafter that overflowed): a NaN logit counts as -inf (its token has probability 0 and is
never ranked above a real one) and a +inf logit as the largest finite fp32 value (so the +inf tokens of a row
share its probability, as in softmax's limit), in both passes and in the reference (`finite_logits`). A row of
NaN or -inf only gives -inf log-probs, ids 0 .. K - 1. So the tree stays a tree of vocabulary ids whatever the
drafter writes; the target's verify keeps the output lossless.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..gdc import gdc_enter, launch_options

# Globals a kernel reads must be tl.constexpr (Triton refuses plain globals when compiling).
# Below every real key: the smallest real key is -inf's, (-2139095041 << 32) | low.
_SENTINEL = tl.constexpr(-9223372036854775807)
# The same in the first pass's 32-bit keys (`_keys32`): below every real one, the smallest being -inf's 0x807F....
_SENTINEL32 = tl.constexpr(-2147483647)
# A +inf logit's high half in the 32-bit keys: above every finite value's (the largest, FLT_MAX's, is 0x7F7F....).
_INF_HI32 = tl.constexpr(0x7F800000)
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# ln 2 split so both halves are exact fp32 constants (Triton makes Python floats fp32).
_LN2_HI = tl.constexpr(0.693145751953125)
_LN2_LO = tl.constexpr(1.428606765330187e-06)
# What a +inf logit counts as: the largest finite fp32 (`_widen`; reference.FLT_MAX).
_FLT_MAX = tl.constexpr(3.4028234663852886e38)
# Whether the selections take `tl.topk` (`_top_keys`). Triton's interpreter runs it ~17x slower than the
# rounds (test_real_vocabulary_in_one_pass: 38.5 s against 2.2 s), so under TRITON_INTERPRET=1 they take
# the rounds, the same keys; tests/ddtree_engine/kernels/test_topk_kernel.py sets this to run its cases
# through `tl.topk` too.
_TOPK = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") != "1")
# The most keys `tl.topk` takes: faster than the rounds at 256 to 1,024 keys (the group stage of 2048-,
# 4096- and 8192-token blocks), 0.2 us slower at 128 (1024-token blocks, one warp), much slower at 4,096 (the
# first pass without groups: the step 56.4 against 37.5 us at budget 15).
_TOPK_MAX = tl.constexpr(1024)
# Tokens per group of the first pass's group stage (`_chunk_keys`); 1 turns the stage off.
DEFAULT_GROUP = 8


@triton.jit
def _chunk_topk(
    logits_ptr,
    stride_row,
    V,
    NCHUNK,
    keys_ptr,
    max_ptr,
    sum_ptr,
    K: tl.constexpr,
    KP: tl.constexpr,
    BLOCK: tl.constexpr,
    GROUP: tl.constexpr,
    LOWBITS: tl.constexpr = 0,
    ROUNDS: tl.constexpr = False,
    GDC: tl.constexpr = False,
):
    gdc_enter(GDC)
    _chunk_keys(logits_ptr, stride_row, V, NCHUNK, keys_ptr, max_ptr, sum_ptr, tl.program_id(0), tl.program_id(1), K, KP, BLOCK,
                GROUP, LOWBITS, ROUNDS)


@triton.jit
def _chunk_keys(
    logits_ptr, stride_row, V, NCHUNK, keys_ptr, max_ptr, sum_ptr, row, chunk,
    K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr, GROUP: tl.constexpr, LOWBITS: tl.constexpr = 0,
    ROUNDS: tl.constexpr = False,
):
    """One block of one row: its max, sum of exp(x - max) and K best keys (the first pass).

    GROUP = 1: the K best of the block's BLOCK keys (`_top_keys`). GROUP > 1: the block as BLOCK / GROUP
    groups of GROUP consecutive tokens; the K best groups (a group's key is its best token's: its max logit,
    ties to the lower group, which holds the lower id), then the K best of those groups' tokens. The K best
    tokens lie in those groups: a group holding one of them has a key at least that token's, and each group
    ranked above it has a better token of its own, so fewer than K do. Same keys out, K * GROUP candidates
    instead of BLOCK in the second selection.

    LOWBITS > 0 (`key_low_bits`: bf16 16, fp16 13; BLOCK <= 2^LOWBITS): the selections rank 32-bit keys
    (`_keys32`: the value's order-preserving high bits, the token's offset in the block in the low LOWBITS, which
    the widened logits leave zero), half the shuffles of the 64-bit ones' (the module's note); the K
    best are widened to the 64-bit keys at the store (`_wide_keys`), the same keys as LOWBITS 0 writes.

    ROUNDS: both selections K rounds of "max, then drop it" (`_best_keys`) instead of `_top_keys`' `tl.topk`: the
    same keys (an H100's first pass, 32-bit keys, 1,024-token blocks, one warp: 4.64 us a launch against 6.60 by
    `tl.topk`, benchmarks/results/firstpass_anatomy_20261205_h100.txt mode 7; not yet timed in the step).
    """
    base_row = logits_ptr + row.to(tl.int64) * stride_row
    start = chunk * BLOCK
    if GROUP == 1:
        local = tl.arange(0, BLOCK)
        valid = start + local < V
        x = _widen(tl.load(base_row + start + local, mask=valid, other=float("-inf")))
        m, s = _max_and_sum(x, valid)
        key = _block_keys(x, start, local, valid, LOWBITS)
    else:
        NG: tl.constexpr = BLOCK // GROUP
        glocal = tl.arange(0, NG) * GROUP  # each group's first token, in the block
        local2 = glocal[:, None] + tl.arange(0, GROUP)[None, :]
        valid2 = start + local2 < V
        x2 = _widen(tl.load(base_row + start + local2, mask=valid2, other=float("-inf")))
        gmax = tl.max(x2, axis=1)
        m = tl.max(gmax, axis=0)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        s = tl.sum(tl.sum(tl.where(valid2, tl.exp(x2 - m_safe), 0.0).to(tl.float64), axis=1), axis=0)
        gkey = _block_keys(gmax, start, glocal, start + glocal < V, LOWBITS)
        chosen = _select(gkey, K, KP, ROUNDS)
        # The chosen groups' tokens, read again (from cache): a group's first token is its key's id.
        real = chosen != _none(chosen)
        cand = _key_local(chosen, start, LOWBITS)
        clocal = cand[:, None] + tl.arange(0, GROUP)[None, :]
        cvalid = real[:, None] & (start + clocal < V)
        cx = _widen(tl.load(base_row + start + clocal, mask=cvalid, other=float("-inf")))
        key = tl.reshape(_block_keys(cx, start, clocal, cvalid, LOWBITS), [KP * GROUP])
    base = (row * NCHUNK + chunk) * KP
    best = _select(key, K, KP, ROUNDS)
    if LOWBITS > 0:
        best = _wide_keys(best, start, LOWBITS)
    tl.store(keys_ptr + base + tl.arange(0, KP), best)
    tl.store(max_ptr + row * NCHUNK + chunk, m)
    tl.store(sum_ptr + row * NCHUNK + chunk, s)


@triton.jit
def _widen(x):
    """Loaded logits as fp32, a NaN as -inf and +inf as the largest finite value (the module's note)."""
    x = x.to(tl.float32)
    x = tl.where(x != x, float("-inf"), x)
    return tl.where(x == float("inf"), _FLT_MAX, x)


@triton.jit
def _top_keys(key, K: tl.constexpr, KP: tl.constexpr):
    """The K largest of the 1-D keys `key` (real keys distinct), best first, in [KP] (sentinels where fewer
    are real). Triton's bitonic top-k (`tl.topk`) where `key` holds KP to `_TOPK_MAX` keys and KP >= 2: it fills
    all KP slots, so slots K .. KP - 1 hold the next best keys. Callers take the KP slots as a superset of the
    K best: the first pass reads the tokens of all KP groups chosen, the merge the keys of all KP blocks
    chosen, and only the merge's final K are stored as the result. Else, or where `_TOPK` is off (the
    interpreter), K rounds of "max, then drop it" (`_best_keys`)."""
    if _TOPK and (KP >= 2) and (key.shape[0] >= KP) and (key.shape[0] <= _TOPK_MAX):
        out = tl.topk(key, KP)
    else:
        out = _best_keys(key, K, KP)
    return out


@triton.jit
def _select(key, K: tl.constexpr, KP: tl.constexpr, ROUNDS: tl.constexpr):
    """The first pass's selections: `_best_keys` where ROUNDS, else `_top_keys`."""
    if ROUNDS:
        out = _best_keys(key, K, KP)
    else:
        out = _top_keys(key, K, KP)
    return out


@triton.jit
def _best_keys(key, K: tl.constexpr, KP: tl.constexpr):
    """The K largest of the distinct 1-D keys `key`, best first, in [KP] (sentinels after K, or where fewer
    than K are real): K rounds of "max, then drop it" (`_top_keys` for K = 1, for fewer than KP or more than
    `_TOPK_MAX` keys, and under the interpreter)."""
    slots = tl.arange(0, KP)
    none = _none(key)
    out = tl.full([KP], none, key.dtype)
    for j in tl.static_range(K):
        best = tl.max(key, axis=0)
        out = tl.where(slots == j, best, out)
        key = tl.where(key == best, none, key)
    return out


@triton.jit
def _none(key):
    """The sentinel of `key`'s width (64-bit keys or the first pass's 32-bit ones)."""
    if key.dtype.is_int32():
        none = _SENTINEL32
    else:
        none = _SENTINEL
    return none


@triton.jit
def _max_and_sum(x, valid):
    """The max of x [BLOCK] and the sum of exp(x - max) over its valid entries (fp64)."""
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(tl.where(valid, tl.exp(x - m_safe), 0.0).to(tl.float64), axis=0)
    return m, s


@triton.jit
def _block_keys(x, start, local, valid, LOWBITS: tl.constexpr):
    """Keys of logits x at offsets `local` of the block starting at token `start`: 64-bit (`_keys`) or, LOWBITS > 0,
    32-bit (`_keys32`)."""
    if LOWBITS > 0:
        key = _keys32(x, local, valid, LOWBITS)
    else:
        key = _keys(x, start + local, valid)
    return key


@triton.jit
def _key_local(key, start, LOWBITS: tl.constexpr):
    """The offset in its block of a key's token (`_block_keys`' keys; a sentinel gives a value not used)."""
    if LOWBITS > 0:
        local = (1 << LOWBITS) - 1 - (key & ((1 << LOWBITS) - 1))
    else:
        local = (0x7FFFFFFF - (key & 0xFFFFFFFF)).to(tl.int32) - start
    return local


@triton.jit
def _ordered_bits(x):
    """fp32 x as int32 bits whose signed order is x's (-0.0 and +0.0, the same log-prob, the same bits)."""
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _keys32(x, local, valid, LOWBITS: tl.constexpr):
    """32-bit keys of logits x (bf16 or fp16 widened, so their low LOWBITS bits are zero) at block offsets `local`
    (< 2^LOWBITS): the order-preserving bits of `_keys` with their low LOWBITS bits replaced by (2^LOWBITS - 1 -
    local), so one integer max takes the larger logit, then the lower id. FLT_MAX (what +inf counts as, `_widen`)
    takes the high half 0x7F80..., above every finite value (bf16's largest shares FLT_MAX's high 16 bits)."""
    LOW: tl.constexpr = (1 << LOWBITS) - 1
    hi = tl.where(x == _FLT_MAX, _INF_HI32, _ordered_bits(x) & ~LOW)
    return tl.where(valid, hi | (LOW - local), _SENTINEL32)


@triton.jit
def _wide_keys(key32, start, LOWBITS: tl.constexpr):
    """`_keys32`' keys of the block starting at token `start` as `_keys`' 64-bit keys (sentinels to sentinels)."""
    LOW: tl.constexpr = (1 << LOWBITS) - 1
    hi = key32 & ~LOW
    local = LOW - (key32 & LOW)
    # A negative value's order-preserving bits have ones in the low bits (bits ^ 0x7FFFFFFF of zero bits).
    ordered = tl.where(hi < 0, hi | LOW, hi)
    ordered = tl.where(hi == _INF_HI32, 0x7F7FFFFF, ordered)  # FLT_MAX's bits
    key = (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - (start + local)).to(tl.int64)
    return tl.where(key32 == _SENTINEL32, _SENTINEL, key)


@triton.jit
def _keys(x, offs, valid):
    """64-bit keys of logits x at token ids offs: one integer max takes the larger logit, then the lower id."""
    key = (_ordered_bits(x).to(tl.int64) << 32) | (0x7FFFFFFF - offs).to(tl.int64)
    return tl.where(valid, key, _SENTINEL)


@triton.jit
def _merge_topk(
    keys_ptr,
    max_ptr,
    sum_ptr,
    NCHUNK,
    vals_ptr,
    ids_ptr,
    K: tl.constexpr,
    KP: tl.constexpr,
    CP: tl.constexpr,
    BLOCK: tl.constexpr,
    GDC: tl.constexpr = False,
):
    gdc_enter(GDC)
    _merge_row(keys_ptr, max_ptr, sum_ptr, NCHUNK, vals_ptr, ids_ptr, tl.program_id(0), K, KP, CP, BLOCK)


@triton.jit
def _log_total(total):
    """log(total) of a row's fp64 sum of exponentials with fp32 transcendentals only (fp64 log is not portable across
    Triton backends): total = 2^e * mant, mant in [1, 2); log(mant) in fp32 is within 6e-8 absolute."""
    tb = total.to(tl.float32).to(tl.int32, bitcast=True)
    e = ((tb >> 23) - 127).to(tl.float64)
    mant = ((tb & 0x007FFFFF) | 0x3F800000).to(tl.float32, bitcast=True)
    return e * _LN2_HI + e * _LN2_LO + tl.log(mant).to(tl.float64)


@triton.jit
def _decoded(best, big, log_total):
    """Merged keys `best` back to (fp64 log-prob, token id): the key's high word is the logit's order-preserving bits,
    its low word 0x7FFFFFFF - id; `big` (the row's max, fp64) and `log_total` shaped to broadcast against `best`."""
    hi = (best >> 32).to(tl.int32)
    bits = hi ^ ((hi >> 31) & 0x7FFFFFFF)
    x = bits.to(tl.float32, bitcast=True).to(tl.float64)
    return (x - big) - log_total, 0x7FFFFFFF - (best & 0xFFFFFFFF)


@triton.jit
def _merge_row(keys_ptr, max_ptr, sum_ptr, NCHUNK, vals_ptr, ids_ptr, row, K: tl.constexpr, KP: tl.constexpr, CP: tl.constexpr,
               BLOCK: tl.constexpr):
    """One row's log-probs and ids from its blocks (the second pass). The loads bypass L1 (.cg):
    tree_step's fused kernel runs this in the program that finished a row's blocks last, reading
    what other programs of the same launch wrote.

    The K best keys: each block wrote its K best, best first, so the row's K best lie in the K blocks
    whose first keys are best (as groups in `_chunk_keys`); the K best of those K blocks' keys are taken, the
    block of a first key read off its token id (id // BLOCK). With no more blocks than KP, of all keys at once."""
    chunks = tl.arange(0, CP)
    cmask = chunks < NCHUNK
    m = tl.load(max_ptr + row * NCHUNK + chunks, mask=cmask, other=float("-inf"), cache_modifier=".cg")
    s = tl.load(sum_ptr + row * NCHUNK + chunks, mask=cmask, other=0.0, cache_modifier=".cg")
    big = tl.max(m, axis=0)
    big_safe = tl.where(big == float("-inf"), 0.0, big)
    scale = tl.where(m == float("-inf"), 0.0, tl.exp(m - big_safe)).to(tl.float64)
    total = tl.sum(s * scale, axis=0)  # >= 1: the row's max contributes exp(0)
    log_total = _log_total(total)
    row_keys = keys_ptr + row * NCHUNK * KP
    if CP <= KP:
        cand = tl.arange(0, CP * KP)
        key = tl.load(row_keys + cand, mask=cand < NCHUNK * KP, other=_SENTINEL, cache_modifier=".cg")
    else:
        heads = tl.load(row_keys + chunks * KP, mask=cmask, other=_SENTINEL, cache_modifier=".cg")
        top = _top_keys(heads, K, KP)
        top_chunk = (0x7FFFFFFF - (top & 0xFFFFFFFF)) // BLOCK
        coffs = top_chunk[:, None] * KP + tl.arange(0, KP)[None, :]
        key = tl.load(row_keys + coffs, mask=(top != _SENTINEL)[:, None], other=_SENTINEL, cache_modifier=".cg")
        key = tl.reshape(key, [KP * KP])
    slots = tl.arange(0, KP)
    logprobs, ids = _decoded(_top_keys(key, K, KP), big_safe.to(tl.float64), log_total)
    tl.store(vals_ptr + row * K + slots, logprobs, mask=slots < K)
    tl.store(ids_ptr + row * K + slots, ids, mask=slots < K)


def _check(draft_logits: torch.Tensor, k: int) -> tuple[int, int]:
    if draft_logits.dim() != 2:
        raise ValueError(f"expected draft_logits [L, V], got shape {tuple(draft_logits.shape)}")
    if draft_logits.dtype not in _DTYPES:
        raise ValueError(f"expected fp32, bf16 or fp16 logits, got {draft_logits.dtype}")
    rows, vocab = draft_logits.shape
    if not 1 <= k <= vocab:
        raise ValueError(f"expected 1 <= k <= V = {vocab}, got k = {k}")
    if vocab >= 2**31:
        raise ValueError(f"expected V < 2^31, got V = {vocab}")
    return rows, vocab


def _outputs(
    draft_logits: torch.Tensor, k: int, out: tuple[torch.Tensor, torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    if out is not None:
        return out
    rows, device = draft_logits.shape[0], draft_logits.device
    return (
        torch.empty(rows, k, dtype=torch.float64, device=device),
        torch.empty(rows, k, dtype=torch.int64, device=device),
    )


def topk_logprobs(
    draft_logits: torch.Tensor,
    k: int,
    block: int = 4096,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    group: int = DEFAULT_GROUP,
    num_warps: int = 4,
    merge_warps: int = 1,
    pdl: bool | None = None,
    rounds: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` most probable tokens per row of `draft_logits`, best first (Triton).

    Args:
        draft_logits: [L, V] fp32/bf16/fp16 logits, rows contiguous, V < 2^31.
        k: candidates per row, 1 <= k <= V.
        block: tokens per program of the first pass (a power of two; capped at V's next power of two).
        out: optional (logprobs [L, k] float64, ids [L, k] int64) to write into (CUDA graphs).
        group: tokens per group of the first pass's group stage (a power of two; 1: no group stage;
            capped at the block).
        num_warps: warps per program of the first pass; merge_warps: of the merge's (one a row).
        pdl: launch both passes with programmatic dependent launch (kernels/gdc.py; None: DDTREE_PDL, else gdc.DEFAULT).
        rounds: the first pass selects by K rounds instead of `tl.topk` (`_chunk_keys`' ROUNDS); the same result.

    Returns:
        (logprobs [L, k] float64, token_ids [L, k] int64): ties to the lower token id.
    """
    rows, vocab = _check(draft_logits, k)
    consts = first_pass_constants(vocab, k, block, group)
    draft_logits = rows_contiguous(draft_logits)
    out = _outputs(draft_logits, k, out)
    if rows == 0:
        return out
    keys, maxes, sums = _first_pass(draft_logits, k, consts, num_warps, pdl=pdl, rounds=rounds)
    _merge_topk[(rows,)](keys, maxes, sums, keys.shape[1], out[0], out[1], K=k, KP=consts["KP"], CP=consts["CP"],
                         BLOCK=consts["BLOCK"], num_warps=merge_warps, **launch_options(draft_logits, pdl))
    return out


def first_pass(
    draft_logits: torch.Tensor,
    k: int,
    block: int = 4096,
    group: int = DEFAULT_GROUP,
    num_warps: int = 4,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    pdl: bool | None = None,
    rounds: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first pass alone (`_chunk_topk`), what the merge reads; the benchmark times it alone.

    Args:
        draft_logits, k, block, group, num_warps: as `topk_logprobs`.
        out: optional (keys, maxes, sums) buffers to fill, shaped as `first_pass_buffers` makes them.
        pdl, rounds: as `topk_logprobs`.

    Returns:
        (keys [L, blocks, KP] int64, maxes [L, blocks] fp32, sums [L, blocks] fp64): each block's K best
        keys, its max and its sum of exponentials.
    """
    rows, vocab = _check(draft_logits, k)
    consts = first_pass_constants(vocab, k, block, group)
    return _first_pass(rows_contiguous(draft_logits), k, consts, num_warps, out, pdl, rounds)


def _first_pass(draft_logits, k, consts, num_warps, out=None, pdl=None, rounds=False):
    """`first_pass` on checked, row-contiguous logits with its constants (topk_logprobs has them already)."""
    rows, vocab = draft_logits.shape
    nchunk = triton.cdiv(vocab, consts["BLOCK"])
    keys, maxes, sums = out or first_pass_buffers(rows, nchunk, consts["KP"], draft_logits.device)
    if rows:
        _chunk_topk[(rows, nchunk)](
            draft_logits, draft_logits.stride(0), vocab, nchunk, keys, maxes, sums, K=k, KP=consts["KP"],
            BLOCK=consts["BLOCK"], GROUP=consts["GROUP"], LOWBITS=key_low_bits(draft_logits.dtype, consts["BLOCK"]),
            ROUNDS=rounds, num_warps=num_warps, **launch_options(draft_logits, pdl),
        )
    return keys, maxes, sums


# The low bits a logit of each dtype leaves zero once widened to fp32 (bf16: a truncated fp32; fp16: 10 of fp32's 23
# mantissa bits), where the first pass's 32-bit keys put the token's offset in its block (`_keys32`).
_ZERO_LOW_BITS = {torch.bfloat16: 16, torch.float16: 13}
# Whether the first pass ranks 32-bit keys where the dtype and block allow (`key_low_bits`); tests turn it off to
# compare both.
KEYS32 = True


def key_low_bits(dtype: torch.dtype, block: int) -> int:
    """The first pass's LOWBITS: the bits of its 32-bit keys that hold a token's offset in its block, or 0 for
    64-bit keys (fp32 logits, a block of more than 2^bits tokens, or `KEYS32` off).

    Args:
        dtype: the logits' dtype; block: tokens per program (BLOCK).

    Returns:
        16 for bf16, 13 for fp16 where the block fits, else 0.
    """
    bits = _ZERO_LOW_BITS.get(dtype, 0)
    return bits if KEYS32 and bits and block <= 1 << bits else 0


def first_pass_constants(vocab: int, k: int, block: int, group: int = DEFAULT_GROUP) -> dict:
    """The two passes' constexprs; tree_step's one-launch kernel takes the same.

    Args:
        vocab: V, the row length; k: candidates per row.
        block: tokens per program of the first pass, a power of two; group: tokens per group, a power of two.

    Returns:
        dict(K, KP: k to a power of two, BLOCK: `block` capped at V's next power of two, GROUP: `group` capped
        at BLOCK, CP: the blocks a row to a power of two).

    Raises:
        ValueError: `block` or `group` not a power of two.
    """
    for name, value in (("block", block), ("group", group)):
        if value < 1 or value & (value - 1):
            raise ValueError(f"expected {name} a power of two, got {name} {value}")
    block = min(block, triton.next_power_of_2(vocab))
    return dict(K=k, KP=triton.next_power_of_2(k), BLOCK=block, GROUP=min(group, block),
                CP=triton.next_power_of_2(triton.cdiv(vocab, block)))


def first_pass_buffers(rows: int, nchunk: int, kp: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Empty buffers for what the first pass hands the merge.

    Args:
        rows: L; nchunk: blocks a row; kp: K to a power of two; device: where to allocate.

    Returns:
        (keys [rows, nchunk, kp] int64, maxes [rows, nchunk] fp32, sums [rows, nchunk] fp64).
    """
    return (
        torch.empty(rows, nchunk, kp, dtype=torch.int64, device=device),
        torch.empty(rows, nchunk, dtype=torch.float32, device=device),
        torch.empty(rows, nchunk, dtype=torch.float64, device=device),
    )


def rows_contiguous(draft_logits: torch.Tensor) -> torch.Tensor:
    """Logits the kernels can index a row of as one run of V values.

    Args:
        draft_logits: [L, V] logits.

    Returns:
        `draft_logits` itself when its stride along V is 1, else a contiguous copy.
    """
    return draft_logits if draft_logits.stride(1) == 1 else draft_logits.contiguous()
