"""Kernels: the tensor pieces of DDTree that get a GPU kernel, one folder each.

Layout, one folder per kernel (after Liger-Kernel and flash-linear-attention)::

    kernels/<name>/__init__.py    what callers import: today the reference; once a kernel lands,
                                  the choice between them (device, dtype, availability)
    kernels/<name>/reference.py   plain PyTorch, fp32 or wider, explicit loops over tree nodes
                                  where that is clearest, shapes in the docstrings; the truth
                                  the kernel is tested against
    kernels/<name>/kernel.py      (future) the @triton.jit kernel and a launcher that validates
                                  its inputs (ValueError(f"expected ..., got ..."))

Today's kernels (references only; no Triton code yet):

- `topk_logprobs`: per-depth log-softmax and sorted top-K over the drafter's [L, V] logits
  (core/tree.py's `build_tree`).
- `tree_mask`: the ancestor-only attention mask [N, N] from a parent array (core/tree.py's
  `compile_tree` and the reference target's verify forward).
- `gdn_tree`: the Gated-DeltaNet causal conv and gated delta recurrence along each node's
  parent path (the reference target's hybrid layers, through core/hybrid.py).

This package sits on the lowest floor: it imports torch and nothing else of the engine, so
core/, the backends and the tests may import it. A whole generation step (the verify walk,
say) is replaced through `reference.steps.DecodeSteps`, not here.
"""
