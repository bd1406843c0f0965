"""How long SGLang's tree causal-conv1d update takes to compile, by a request's verify rows: no GPU needed.

SGLang 0.5.23's hybrid (Gated-DeltaNet) target verify runs `_causal_conv1d_update_kernel` with its tree path
(`HAS_EAGLE_TREE_CUSTOM_ATTN_MASK`, which DDTREE takes at topk > 1). The kernel unrolls `tl.static_range(seqlen)`
over one request's verify rows (DDTREE: budget + 1), each iteration reducing over all of them, so its code and
compile time grow faster than the rows: the first start of a DDTREE service at a wide budget spends that long
before it answers (sglang_h100_wide*_2026-12-05.json: 166 s at 129 rows on the H100 host's CPU, six servers
starting at once). Deploy keeps each service's Triton cache (deploy/units.py default_env) and warns from budget
128 (deploy/plan.py WIDE_COMPILE_BUDGET).

This script compiles that kernel for sm_90 (Triton's own ptxas; no driver) with the constants SGLang's launcher
passes for a bf16 conv of 8,192 channels, width 4, 256 channels a program, and prints the seconds and PTX lines
per row count (with --chain, the kernel's chain path beside it; with --ddtree, the engine's replacement,
kernels/tree_conv_update, whose code does not grow with the rows). Run it with the sglang environment's Python
(it imports sglang and its Triton):

    TRITON_DEFAULT_FP_FUSION=1 .venv-sglang/bin/python benchmarks/sglang_conv_compile.py --ddtree 16 32 64 129 257
"""

from __future__ import annotations

import argparse
import inspect
import os
import platform
import sys
import time

os.environ["TRITON_ALWAYS_COMPILE"] = "1"  # every row count compiled here, not read back from Triton's cache
os.environ["TRITON_INTERPRET"] = "0"  # compiled, never run: the interpreter's jit objects cannot compile
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

POINTERS = {
    "x_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16", "conv_state_ptr": "*bf16", "cache_seqlens_ptr": "*i32",
    "conv_state_indices_ptr": "*i32", "num_accept_tokens_ptr": "*i32", "intermediate_conv_window_ptr": "*bf16",
    "intermediate_state_indices_ptr": "*i32", "retrieve_next_token_ptr": "*i64", "retrieve_next_sibling_ptr": "*i64",
    "retrieve_parent_token_ptr": "*i64", "o_ptr": "*bf16",
}


def constants(rows: int, dim: int = 8192, width: int = 4, tree: bool = True) -> dict:
    """The launcher's constexprs for x [batch, dim, rows] (token-major, as the GDN backend's transposed view),
    conv state [lines, dim, width - 1], the intermediate windows [lines, rows, dim, width - 1], and the tree links."""
    win = width - 1
    return dict(
        dim=dim, seqlen=rows, state_len=win, num_cache_lines=64,
        stride_x_seq=dim * rows, stride_x_dim=1, stride_x_token=dim, stride_w_dim=width, stride_w_width=1,
        stride_conv_state_seq=dim * win, stride_conv_state_dim=1, stride_conv_state_tok=dim, stride_state_indices=1,
        stride_inter_seq=rows * dim * win, stride_inter_step=dim * win, stride_inter_dim=win, stride_inter_win=1,
        stride_intermediate_state_indices=1, stride_retrieve_next_token_seq=rows, stride_retrieve_next_token_token=1,
        stride_retrieve_next_sibling_seq=rows, stride_retrieve_next_sibling_token=1,
        stride_retrieve_parent_token_seq=rows, stride_retrieve_parent_token_token=1,
        stride_o_seq=dim * rows, stride_o_dim=1, stride_o_token=dim, pad_slot_id=-1,
        HAS_BIAS=False, KERNEL_WIDTH=width, SILU_ACTIVATION=True, IS_CONTINUOUS_BATCHING=True, IS_SPEC_DECODING=False,
        NP2_STATELEN=triton.next_power_of_2(win), NP2_SEQLEN=triton.next_power_of_2(rows), USE_PAD_SLOT=True,
        BLOCK_N=256, SAVE_INTERMEDIATE=True, HAS_EAGLE_TREE_CUSTOM_ATTN_MASK=tree, USE_GDC=False,
    )


def compile_seconds(rows: int, tree: bool = True) -> tuple[float, int]:
    from sglang.kernels.ops.mamba.causal_conv1d_triton import _causal_conv1d_update_kernel as kernel

    params = list(inspect.signature(kernel.fn).parameters)
    cs = constants(rows, tree=tree)
    unknown = [p for p in params if p not in cs and p not in POINTERS and p != "batch"]
    if unknown:
        raise SystemExit(f"sglang_conv_compile.py: the kernel's parameters changed ({unknown}): this script knows 0.5.23's")
    signature = {p: POINTERS.get(p, "i32" if p == "batch" else "constexpr") for p in params}
    start = time.perf_counter()
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=cs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    return time.perf_counter() - start, compiled.asm["ptx"].count("\n")


def ddtree_compile_seconds(rows: int, width: int = 4, parents_given: bool = False) -> tuple[float, int, int, int, int]:
    """The same for kernels/tree_conv_update, with the constants its launcher passes for that call (bf16 x and state,
    no bias, the windows kept, cache lines indexed). None of them depends on the rows (kernel.constexprs), so every
    width compiles the same code: compiled again here at each all the same, to show it. Also returns the PTX's
    barriers (`bar.sync`: the parent phase's rounds have one each), warp shuffles (`shfl`: the given variant's
    ancestor walk by tl.gather in registers) and shared-memory loads and stores (`ld.shared`, `st.shared`). The line
    count includes the debug info's source path, so it is comparable only between compiles from one checkout."""
    from ddtree_engine.kernels.tree_conv_update.kernel import _tree_conv_update_kernel as kernel
    from ddtree_engine.kernels.tree_conv_update.kernel import constexprs

    del rows
    cs = {**constexprs(width, has_bias=False, silu=True, has_indices=True, save_intermediate=True,
                       parents_given=parents_given), "GDC": False}
    pointers = {"nt_ptr": "*i64", "ns_ptr": "*i64", "par_ptr": "*i64", "scratch_ptr": "*i32", "state_idx_ptr": "*i32",
                "inter_idx_ptr": "*i32"}
    params = list(inspect.signature(kernel.fn).parameters)
    signature = {p: "constexpr" if p in cs else pointers.get(p, "*bf16" if p.endswith("_ptr") else "i32") for p in params}
    start = time.perf_counter()
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=cs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ptx = compiled.asm["ptx"]
    shared = ptx.count("ld.shared") + ptx.count("st.shared")
    return time.perf_counter() - start, ptx.count("\n"), ptx.count("bar.sync"), ptx.count("shfl.sync"), shared


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="+", type=int, help="verify rows a request (DDTREE: budget + 1)")
    parser.add_argument("--chain", action="store_true",
                        help="also compile the kernel's chain path (a DFLASH verify, or DDTREE at topk 1) at each row count")
    parser.add_argument("--ddtree", action="store_true",
                        help="also compile the engine's kernels/tree_conv_update (the same arrays) at each row count")
    args = parser.parse_args(argv)
    if any(r < 1 for r in args.rows):
        parser.error("rows must be >= 1")
    import sglang

    print(f"# sglang {sglang.__version__}, triton {triton.__version__}, sm_90 target, {platform.processor() or platform.machine()}")
    for rows in args.rows:
        for tree in (True, False) if args.chain else (True,):
            seconds, lines = compile_seconds(rows, tree=tree)
            print(f"rows {rows:4d} (budget {rows - 1:3d}) {'tree ' if tree else 'chain'}: compile {seconds:6.1f} s, "
                  f"{lines} PTX lines", flush=True)
        if args.ddtree:  # and its variant for a layer that takes the parents given (tree_conv_update's parents_given)
            for given in (False, True):
                seconds, lines, barriers, shuffles, shared = ddtree_compile_seconds(rows, parents_given=given)
                print(f"rows {rows:4d} (budget {rows - 1:3d}) {'ddtree-given' if given else 'ddtree'}: compile "
                      f"{seconds:6.1f} s, {lines} PTX lines, {barriers} barriers, {shuffles} shuffles, "
                      f"{shared} shared loads and stores", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
