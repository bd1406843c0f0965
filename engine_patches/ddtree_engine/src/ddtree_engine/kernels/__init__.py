"""Kernels: the tensor pieces of DDTree that get a GPU kernel, one folder each.

Layout, one folder per kernel (after Liger-Kernel and flash-linear-attention)::

    kernels/<name>/__init__.py    what callers import: the kernel on CUDA tensors when triton imports,
                                  the reference elsewhere (dispatch.py; DDTREE_KERNELS forces a side)
    kernels/<name>/reference.py   plain PyTorch, explicit loops over tree nodes where that is clearest,
                                  shapes in the docstrings; the truth the kernel is tested against
    kernels/<name>/kernel.py      the @triton.jit kernel and a launcher that validates its inputs
                                  (ValueError(f"expected ..., got ..."))

The kernels:

- `topk_logprobs`: per-depth log-softmax and top-K over the drafter's [L, V] logits.
- `tree_build`: the best-first tree over the [L, K] top-K table (core/tree.py's `build_tree`).
- `tree_mask`: the ancestor-only mask (dense and bit-packed), positions, first-child / next-sibling
  links, and SGLang's flat verify mask.
- `tree_walk`: the accepted path, bonus token and commit length from the target's choices.
- `tree_step`: the four above as one step with preallocated buffers and no host sync (CUDA graphs).
- `gdn_tree`: the Gated-DeltaNet causal conv and gated delta recurrence along each node's
  parent path, and the commit (the reference target's hybrid layers, through core/hybrid.py).
- `tree_conv_update`: the tree causal conv in SGLang's verify layout (the plugin's
  DDTREE_SGLANG_TREE_CONV).

`gdc.py` holds the programmatic-dependent-launch switch the step kernels share.

This package sits on the lowest floor: it imports torch and nothing else of the engine, so
core/, the backends and the tests may import it. A whole generation step (the verify walk,
say) is replaced through `reference.steps.DecodeSteps`, not here.
"""
