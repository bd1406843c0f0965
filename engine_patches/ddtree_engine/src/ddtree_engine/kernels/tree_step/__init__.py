"""The whole DDTree step on the device: top-K -> build -> compile -> walk, fixed shapes.

`TreeStep` owns every buffer of one (L, V, budget, topk, spine) shape and only launches kernels
into them: no host synchronisation, no shape that depends on the data, so `build` and `walk`
can be captured in a CUDA graph and replayed on new logits (tests/ddtree_engine/kernels/
test_tree_step.py does). `reference_step` computes the same arrays with the references.

Shapes: N = budget + 1 tree rows (padding after num_nodes: token = root, parent -1, depth 0).
"""

from __future__ import annotations

import torch

from ..dispatch import kernel_module
from ..tree_build import reference as build_reference
from ..tree_build import root_only
from ..tree_mask import reference as mask_reference
from ..tree_walk import reference as walk_reference
from ..topk_logprobs import reference as topk_reference

# The budget from which TreeStep builds by threshold (tree_build/threshold.py). H200, 2026-12-04 ~21:05 UTC, whole
# step in a CUDA graph, bf16 [15, 151,936] logits, 7 draws (benchmarks/results/build_threshold_cut2_20261204.txt):
# budget 256 51.1-58.8 us against the serial build's 121.8-125.3, 128 40.4-56.4 against 72.8-77.6 (faster on every
# draw at both); 64 38.4-55.4 against 40.0-44.9 (slower on 4 of 7: its fixed ~15 us floor against a 21 us build).
THRESHOLD_FROM_BUDGET = 128

__all__ = ["TreeStep", "reference_step"]


class TreeStep:
    """Preallocated buffers and the four kernels of one step shape (three where the serial build compiles the tree in
    its own launch: `compile_in_build`, up to budget 32).

    Args:
        depths: L, drafted depths (rows of the draft logits).
        vocab: V.
        budget: drafted nodes; topk: candidates per depth (K = min(topk, budget, V)).
        device: a CUDA device (or the CPU under TRITON_INTERPRET=1).
        spine_depth: reserve the top-1 chain down to this depth first.
        build_method: the build kernel's selection, "serial" (the heap, pop by pop), "levels"
            (tree_build/levels.py: the same trees level by level) or "threshold" (tree_build/threshold.py:
            the prefixes above a bound of the budget-th best score); both build spines serially, and the
            one-launch build (`fused`) takes "serial" or "levels". None: "threshold" from budget
            `THRESHOLD_FROM_BUDGET` where it takes the shape (not fused; tree_build.kernel.threshold_fits), else
            "serial".
        fused: run `build` as one kernel launch (tree_step/kernel.py: top-K, build and compile in
            the programs that finish last) instead of four; the same arrays.
        topk_block: tokens per program of the top-K's first pass (a power of two; tests make it
            small so small vocabularies still take several blocks a row).
        topk_group: tokens per group of that pass's group stage (a power of two, 1 for none; None:
            the kernel's default).
        topk_warps: warps per program of that pass (the one-launch build: of every program).
        topk_rounds: that pass selects by K rounds instead of `tl.topk` (topk_logprobs.kernel.topk_logprobs'
            `rounds`); the same arrays.
        pdl: launch the kernels with programmatic dependent launch (kernels/gdc.py: each kernel's programs
            start while the one before drains, then wait for its writes) where the GPU can (compute capability
            9.0 and later); None: as DDTREE_PDL says, else gdc.DEFAULT (on). The same arrays either way.
    """

    def __init__(
        self,
        depths: int,
        vocab: int,
        budget: int,
        topk: int,
        device: torch.device | str,
        spine_depth: int = 0,
        build_method: str | None = None,
        fused: bool = False,
        topk_block: int = 4096,
        topk_group: int | None = None,
        pdl: bool | None = None,
        topk_warps: int = 4,
        topk_rounds: bool = False,
    ):
        if depths < 1 or budget < 0 or topk < 1:
            raise ValueError(f"expected L >= 1, budget >= 0, topk >= 1, got L {depths}, budget {budget}, topk {topk}")
        if build_method not in (None, "serial", "levels", "threshold"):
            raise ValueError(f"expected build_method 'serial', 'levels' or 'threshold', got {build_method!r}")
        if fused and build_method == "threshold":
            raise ValueError("the one-launch build (fused=True) takes build_method 'serial' or 'levels', not 'threshold'")
        self.depths, self.vocab, self.budget, self.spine_depth = depths, vocab, budget, spine_depth
        self.build_method = build_method
        self.k = min(topk, budget, vocab)
        self.device = torch.device(device)
        self.topk_kernel = kernel_module(__package__.rsplit(".", 1)[0] + ".topk_logprobs")
        self.build_kernel = kernel_module(__package__.rsplit(".", 1)[0] + ".tree_build")
        if self.build_method is None:
            wide = budget >= THRESHOLD_FROM_BUDGET and not fused and self.k > 0
            wide = wide and self.build_kernel.threshold_fits(budget, self.k, depths)
            self.build_method = "threshold" if wide else "serial"
        self.mask_kernel = kernel_module(__package__.rsplit(".", 1)[0] + ".tree_mask")
        self.walk_kernel = kernel_module(__package__.rsplit(".", 1)[0] + ".tree_walk")
        if self.k > 0 and not self.build_kernel.supports(depths, self.k, budget):
            raise ValueError(f"the build kernel cannot lay out L {depths} with K {self.k}")
        n = budget + 1 if self.k > 0 else 1
        long = dict(dtype=torch.int64, device=self.device)
        self.vals = torch.empty(depths, max(self.k, 1), dtype=torch.float64, device=self.device)
        self.ids = torch.empty(depths, max(self.k, 1), **long)
        self.tree = (
            *(torch.empty(n, **long) for _ in range(4)),
            torch.empty(n, dtype=torch.float64, device=self.device),
            torch.empty(1, **long),
        )
        words = (n + 31) // 32
        self.compiled = (
            torch.empty(n, n, dtype=torch.bool, device=self.device),
            torch.empty(n, words, dtype=torch.int32, device=self.device),
            *(torch.empty(n, **long) for _ in range(3)),
        )
        self.walked = (torch.empty(n, **long), torch.empty(n, **long), torch.empty(1, **long), torch.empty(1, **long))
        from ..gdc import enabled  # imports triton, as the kernel modules above do

        self.pdl = enabled(self.vals, pdl)
        self.topk_block = topk_block
        self.topk_params = dict(block=topk_block, pdl=self.pdl, num_warps=topk_warps, rounds=topk_rounds)
        if topk_group is not None:
            self.topk_params["group"] = topk_group
        self.fused = None
        if fused and self.k > 0:
            self.fused = kernel_module(__name__).FusedBuild(self, **self.topk_params)
        # The serial build on one warp compiles the tree itself up to budget 32 (tree_build.kernel.compiles_in_build,
        # COMPILE_IN_BUILD): one launch fewer.
        self.compile_in_build = (self.fused is None and self.k > 0 and self.build_method == "serial"
                                 and self.build_kernel.COMPILE_IN_BUILD
                                 and self.build_kernel.compiles_in_build(budget, self.k, "serial"))

    @property
    def num_rows(self) -> int:
        """N, the fixed number of tree rows."""
        return int(self.tree[0].shape[0])

    def build(self, draft_logits: torch.Tensor, root: torch.Tensor, prefix_len: torch.Tensor) -> None:
        """Top-K, tree build and compile into this step's buffers (kernels only).

        Args:
            draft_logits: [L, V] fp32/bf16/fp16 on the device.
            root: [1] int64, the root token; prefix_len: [1] int64, the root's position.
        """
        if tuple(draft_logits.shape) != (self.depths, self.vocab):
            raise ValueError(f"expected draft_logits [{self.depths}, {self.vocab}], got {tuple(draft_logits.shape)}")
        if self.k == 0:
            for buf, val in zip(self.tree, root_only(root)):
                buf.copy_(val)
        elif self.fused is not None:
            self.fused(draft_logits, root, prefix_len)
            return
        else:
            self.topk_kernel.topk_logprobs(draft_logits, self.k, out=(self.vals, self.ids), **self.topk_params)
            into = dict(compiled=self.compiled, prefix_len=prefix_len) if self.compile_in_build else {}
            self.build_kernel.build_tree_arrays(
                self.vals, self.ids, self.budget, root, self.spine_depth, out=self.tree, method=self.build_method,
                pdl=self.pdl, **into,
            )
            if self.compile_in_build:
                return
        tokens, parents, depths, _, _, num_nodes = self.tree
        self.mask_kernel.compile_tree_arrays(parents, depths, num_nodes, prefix_len, self.depths, out=self.compiled,
                                             pdl=self.pdl)

    def walk(self, target_choice: torch.Tensor) -> None:
        """Walk the built tree with the target's choices [N] into this step's `walked` buffers (its siblings carry
        distinct tokens, a depth's top-K ids, so the walk skips the first-match compare: tree_walk.kernel)."""
        tokens, parents, _, _, _, num_nodes = self.tree
        self.walk_kernel.walk_arrays(tokens, parents, num_nodes, target_choice, self.depths, out=self.walked, pdl=self.pdl,
                                     distinct_siblings=True)


def reference_step(
    draft_logits: torch.Tensor,
    budget: int,
    topk: int,
    root_token: int,
    prefix_len: int,
    target_choice: torch.Tensor | None,
    spine_depth: int = 0,
    topk_table: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], tuple[torch.Tensor, ...] | None]:
    """The same step with the references, on the CPU.

    Args:
        draft_logits: [L, V] (any device); budget, topk, spine_depth: as TreeStep.
        root_token, prefix_len: the root and its position.
        target_choice: [N] the target's choices, or None to skip the walk.
        topk_table: ([L, K] log-probs, [L, K] ids) to build from instead of the float64 top-K of
            `draft_logits`. The kernel's log-probs are within ~1e-7 of float64 (fp32 exp), so two
            prefixes whose scores tie in exact arithmetic (common with bf16 logits) can be ordered
            either way; a test feeds the kernel's own table here to compare the build bit for bit
            and checks the table against float64 on its own.

    Returns:
        (tree arrays, compiled arrays, walked arrays or None), shaped like TreeStep's buffers.
    """
    logits = draft_logits.cpu()
    k = min(topk, budget, logits.shape[1])
    if k == 0 or logits.shape[0] == 0:
        tree = root_only(torch.tensor([root_token]))
    else:
        vals, ids = topk_reference.sorted_topk_logprobs(logits, k) if topk_table is None else (t.cpu() for t in topk_table)
        tree = build_reference.build_tree_arrays(vals, ids, budget, root_token, spine_depth)
    tokens, parents, depths, _, _, num_nodes = tree
    n = int(num_nodes[0])
    compiled = mask_reference.compile_tree_arrays(parents, depths, n, prefix_len)
    walked = None if target_choice is None else walk_reference.walk_arrays(tokens, parents, n, target_choice.cpu())
    return tree, compiled, walked
