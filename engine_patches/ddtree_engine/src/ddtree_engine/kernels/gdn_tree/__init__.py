"""Gated-DeltaNet over a draft tree: causal conv and gated delta recurrence, parent-indexed.

What callers import: each function runs the Triton kernel (`kernel.py`) on CUDA tensors when
triton imports, and the PyTorch reference (`reference.py`) elsewhere, so CPU behaviour is the
reference's; `DDTREE_KERNELS` forces a side (kernels/dispatch.py). triton is imported only
when the kernel is chosen: a host without it keeps working with the references."""

from __future__ import annotations

import torch

from ..dispatch import kernel_module, use_kernel
from . import reference
from .reference import node_levels

__all__ = ["commit_gdn_state", "gated_delta_tree", "node_levels", "tree_causal_conv", "use_kernel"]


def _kernel():
    return kernel_module(__name__)


def tree_causal_conv(
    x: torch.Tensor,
    committed_window: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    window_index: torch.Tensor,
) -> torch.Tensor:
    """Depthwise causal conv along each node's ancestor path, then SiLU.

    Args:
        x: [T, C] conv inputs of the nodes.
        committed_window: [K-1, C] the last K-1 committed inputs, oldest first.
        weight: [C, K] depthwise kernel (weight[:, K-1] multiplies the newest input).
        bias: [C] or None.
        window_index: [T, K] from `core.hybrid.conv_window_index`.

    Returns:
        [T, C] activations.
    """
    if use_kernel(x):
        return _kernel().tree_causal_conv(x, committed_window, weight, bias, window_index)
    return reference.tree_causal_conv(x, committed_window, weight, bias, window_index)


def gated_delta_tree(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: list[int] | torch.Tensor,
    initial_state: torch.Tensor,
    keep_states: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule along tree paths (the kernel: all nodes in one launch).

    Args:
        query, key: [T, Hk, Dk] (already L2-normalised; query already scaled by Dk**-0.5);
            Hk divides H (value head h reads key head h // (H / Hk)).
        value: [T, H, Dv]. g (log decay), beta: [T, H].
        parents: [T] parent per node (a list, or an integer tensor the kernel reads on the
            device), -1 = start from `initial_state` [H, Dk, Dv]; parents precede children.
        keep_states: keep every node's state (tree verify); else only the last node's, and
            `parents` must be a chain [-1, 0, 1, ...].

    Returns:
        (out [T, H, Dv], states [T, H, Dk, Dv] if keep_states else [1, H, Dk, Dv] of node T-1),
        in initial_state's dtype.
    """
    if not use_kernel(value):
        plist = parents.tolist() if isinstance(parents, torch.Tensor) else list(parents)
        return reference.gated_delta_tree(query, key, value, g, beta, plist, initial_state, keep_states)
    num_nodes = value.shape[0]
    if isinstance(parents, torch.Tensor):
        tree = parents.to(device=value.device)
    else:
        bad = [i for i, p in enumerate(parents) if not -1 <= p < i]
        if bad:
            raise ValueError(f"expected every parent before its child, got node {bad[0]} with parent {parents[bad[0]]}")
        chain = list(parents) == list(range(-1, num_nodes - 1))
        if not keep_states and not chain:
            raise ValueError("keep_states=False is only for linear sequences (parents [-1, 0, 1, ...])")
        # A chain needs no parent reads: the kernel's chain mode keeps the state in registers.
        tree = None if chain else torch.tensor(parents, dtype=torch.int32, device=value.device)
    return _kernel().gated_delta_tree(query, key, value, g, beta, tree, initial_state, keep_states)


def commit_gdn_state(
    states: torch.Tensor,
    node: torch.Tensor | int,
    state_out: torch.Tensor,
    conv_input: torch.Tensor,
    window_index: torch.Tensor,
    window: torch.Tensor,
) -> None:
    """Write the accepted node's recurrent state and conv window into the cache slot.

    Args:
        states: [T, H, Dk, Dv] per-node states of the verify forward.
        node: the last accepted node (int, or a one-element integer tensor: the kernel reads
            it on the device, no host synchronisation).
        state_out: [H, Dk, Dv] the cache's state slot, overwritten.
        conv_input: [T, C] the nodes' conv inputs.
        window_index: [T, K] the verify forward's window index.
        window: [K-1, C] the committed window, overwritten in place with the newest K-1 inputs
            of the accepted node's path.
    """
    if use_kernel(states):
        _kernel().commit_gdn_state(states, node, state_out, conv_input, window_index, window)
    else:
        reference.commit_gdn_state(states, node, state_out, conv_input, window_index, window)
