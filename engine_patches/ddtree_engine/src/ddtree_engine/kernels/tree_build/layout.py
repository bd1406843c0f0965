"""The chosen nodes written out depth-major, shared by the builds (kernel.py's serial build, levels.py's, threshold.py's).

A node's place is 1 + the number of chosen nodes with a smaller layout key: depth above `_KEY_BITS`, the rank
path below (B bits a level), which is the reference's order (by depth, then the parent's place, then rank). The
threshold build's chosen keys come in that order already (`_write_sorted_tree`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .shapes import KEY_BITS

# Globals a kernel reads must be tl.constexpr (Triton refuses plain globals when compiling).
_NONE = tl.constexpr(9223372036854775807)  # a layout key after every chosen node's (padding rows)
_KEY_BITS = tl.constexpr(KEY_BITS)  # rank-path bits below the depth in the layout key


@triton.jit
def _count_below(keys_ptr, n, rows_key, NB: tl.constexpr, COLS: tl.constexpr):
    """Per row of rows_key [NB, 1]: how many of the first n keys at keys_ptr are smaller (int32), COLS
    keys at a time, each tile loaded as a row ([1, COLS]) against the column. Measured on the H200 (2026-12-03,
    build alone in a CUDA graph, the loop's pops skipped): budget 256 5.3 us against 21.9 with the 1-D keys
    expanded to both axes, budget 64 5.1 against 8.3."""
    count = tl.zeros([NB], dtype=tl.int32)
    for j0 in range(0, NB, COLS):
        cj = j0 + tl.arange(0, COLS)
        kj = tl.load(keys_ptr + cj[None, :], mask=cj[None, :] < n, other=_NONE)
        count += tl.sum((kj < rows_key).to(tl.int32), axis=1)
    return count


@triton.jit
def _write_tree(
    place, par_place, dep, rnk, score, cm, n_chosen, root_ptr, ids_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr, score_ptr,
    n_ptr, BUDGET: tl.constexpr, K: tl.constexpr, NP: tl.constexpr,
):
    """The builds' output: each chosen node (cm) at its place, its token read off the [L, K] ids (`_write_nodes`)."""
    tok = tl.load(ids_ptr + dep * K + rnk, mask=cm, other=0)
    _write_nodes(place, par_place, dep, rnk, tok, score, cm, n_chosen, root_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr,
                 score_ptr, n_ptr, BUDGET, NP)


@triton.jit
def _write_nodes(
    place, par_place, dep, rnk, tok, score, cm, n_chosen, root_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr, score_ptr,
    n_ptr, BUDGET: tl.constexpr, NP: tl.constexpr,
):
    """Each chosen node (cm) with its token at its place, the root at 0, padding after the last (kernel.py's serial
    build reads the tokens early, before its layout)."""
    root = tl.load(root_ptr)
    tl.store(tok_ptr + place, tok, mask=cm)
    tl.store(par_ptr + place, par_place, mask=cm)
    tl.store(dep_ptr + place, dep.to(tl.int64) + 1, mask=cm)
    tl.store(rank_ptr + place, rnk.to(tl.int64), mask=cm)
    tl.store(score_ptr + place, score, mask=cm)
    ni = tl.arange(0, NP)
    rest = (ni < BUDGET + 1) & ((ni == 0) | (ni > n_chosen))
    tl.store(tok_ptr + ni, tl.zeros([NP], dtype=tl.int64) + root, mask=rest)
    tl.store(par_ptr + ni, tl.full([NP], -1, tl.int64), mask=rest)
    tl.store(dep_ptr + ni, tl.zeros([NP], dtype=tl.int64), mask=rest)
    tl.store(rank_ptr + ni, tl.full([NP], -1, tl.int64), mask=rest)
    tl.store(score_ptr + ni, tl.where(ni == 0, 0.0, float("-inf")).to(tl.float64), mask=rest)
    tl.store(n_ptr, (n_chosen + 1).to(tl.int64))


@triton.jit
def _chosen_nodes(keys_ptr, scores_ptr, n_chosen, top, B: tl.constexpr, NB: tl.constexpr):
    """The n_chosen layout keys at keys_ptr (the rank path's root level at bit `top`) and their scores, read as [NB]
    vectors: (index, in range, score, depth, rank, key)."""
    gi = tl.arange(0, NB)
    cm = gi < n_chosen
    key = tl.load(keys_ptr + gi, mask=cm, other=_NONE)
    score = tl.load(scores_ptr + gi, mask=cm, other=0.0)
    dep = (key >> _KEY_BITS).to(tl.int32)
    rnk = ((key >> (top - B * dep).to(tl.int64)) & ((1 << B) - 1)).to(tl.int32)
    return gi, cm, score, dep, rnk, key


@triton.jit
def _parent_key(key, top, B: tl.constexpr):
    """The layout key of each key's parent (any shape): one level up, the key's own rank cleared."""
    dep = key >> _KEY_BITS
    one = tl.zeros_like(key) + 1
    return ((dep - 1) << _KEY_BITS) | ((key & ((one << _KEY_BITS) - 1)) & ~(((one << B) - 1) << (top - B * dep)))


@triton.jit
def _write_keyed_tree(
    keys_ptr, scores_ptr, n_chosen, top, root_ptr, ids_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr, score_ptr, n_ptr,
    BUDGET: tl.constexpr, K: tl.constexpr, B: tl.constexpr, NB: tl.constexpr, NP: tl.constexpr, COLS: tl.constexpr,
):
    """The levels and threshold builds' output from their chosen nodes' layout keys (n_chosen of them at keys_ptr,
    scores at scores_ptr; the rank path's root level at bit `top`): a node's place is 1 + the chosen keys below its
    own, its parent's the same for the parent's key (the node's with its own rank cleared, one level up); both
    counts on the keys read back as a column (`_count_below`)."""
    gi, cm, score, dep, rnk, _ = _chosen_nodes(keys_ptr, scores_ptr, n_chosen, top, B, NB)
    keyr = tl.load(keys_ptr + gi[:, None], mask=cm[:, None], other=_NONE)
    pkeyr = _parent_key(keyr, top, B)
    place = _count_below(keys_ptr, n_chosen, keyr, NB, COLS).to(tl.int64) + 1
    pplace = _count_below(keys_ptr, n_chosen, pkeyr, NB, COLS).to(tl.int64)
    pplace = tl.where(dep > 0, pplace + 1, 0)
    _write_tree(place, pplace, dep, rnk, score, cm, n_chosen, root_ptr, ids_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr,
                score_ptr, n_ptr, BUDGET, K, NP)


@triton.jit
def _write_sorted_tree(
    keys_ptr, scores_ptr, n_chosen, top, root_ptr, ids_ptr, tok_ptr, par_ptr, dep_ptr, rank_ptr, score_ptr, n_ptr,
    BUDGET: tl.constexpr, K: tl.constexpr, B: tl.constexpr, NB: tl.constexpr, NP: tl.constexpr,
):
    """`_write_keyed_tree`'s output from chosen layout keys in ascending order (threshold.py's pool keeps its entries
    so): a node's place is 1 + its index, its parent's 1 + the parent key's index, found by a binary search over
    the keys (log2 NB + 1 loads a node) instead of counting every key below it. H200 2026-12-04
    (benchmarks/results/build_threshold_cut2_20261204.*): the threshold build's layout took 12-13 us at budget 256
    with the two counts."""
    gi, cm, score, dep, rnk, key = _chosen_nodes(keys_ptr, scores_ptr, n_chosen, top, B, NB)
    pkey = _parent_key(key, top, B)
    # Lower bound of pkey in the NB keys (those past n_chosen read as _NONE, above every key): halve the range.
    lo = tl.zeros([NB], dtype=tl.int32)
    for step in tl.static_range(13):
        if (NB >> (step + 1)) >= 1:
            probe = lo + (NB >> (step + 1)) - 1
            kp = tl.load(keys_ptr + probe, mask=cm & (probe < n_chosen), other=_NONE)
            lo = tl.where(kp < pkey, lo + (NB >> (step + 1)), lo)
    kp = tl.load(keys_ptr + lo, mask=cm & (lo < n_chosen), other=_NONE)
    lo = tl.where(kp < pkey, lo + 1, lo)
    pplace = tl.where(dep > 0, lo.to(tl.int64) + 1, 0)
    _write_tree(gi.to(tl.int64) + 1, pplace, dep, rnk, score, cm, n_chosen, root_ptr, ids_ptr, tok_ptr, par_ptr, dep_ptr,
                rank_ptr, score_ptr, n_ptr, BUDGET, K, NP)
