"""The verify walk: follow the target's own choices down the tree (pure PyTorch reference)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels import tree_walk
from ..kernels.dispatch import use_kernel
from .tree import CompiledTree


@dataclass(frozen=True)
class WalkResult:
    """path: accepted node indices, starting with the root 0; bonus_token: the target's choice
    at the last accepted node (no child matched it); commit_len: tokens this step emits
    (accepted drafts + the bonus)."""

    path: list[int]
    accepted_tokens: list[int]
    bonus_token: int

    @property
    def accepted_drafts(self) -> int:
        return len(self.path) - 1

    @property
    def commit_len(self) -> int:
        return len(self.path)


def walk(compiled: CompiledTree, target_choice: torch.Tensor) -> WalkResult:
    """Walk the tree with the target's choice at each node.

    Args:
        compiled: the verified tree.
        target_choice: [N] the target's token at every node (argmax at T=0, one independent
            sample per node at T>0). Every emitted token is the target's choice in its true
            context, which is why the walk is lossless at any temperature.

    Returns:
        The accepted path, its drafted tokens, and the bonus token. With choices on CUDA (or
        DDTREE_KERNELS=triton) kernels/tree_walk's kernel walks on the choices' device.
    """
    if use_kernel(target_choice):
        return _walk_with_kernel(compiled, target_choice)
    choice = target_choice.tolist()
    tokens = compiled.tree.tokens.tolist()
    first_child = compiled.first_child.tolist()
    next_sibling = compiled.next_sibling.tolist()
    node = 0
    path = [0]
    while True:
        want = choice[node]
        child = first_child[node]
        while child >= 0 and tokens[child] != want:
            child = next_sibling[child]
        if child < 0:
            return WalkResult(path=path, accepted_tokens=[tokens[i] for i in path[1:]], bonus_token=want)
        node = child
        path.append(node)


def _walk_with_kernel(compiled: CompiledTree, target_choice: torch.Tensor) -> WalkResult:
    device = target_choice.device
    tree = compiled.tree
    path, emitted, commit_len, bonus = tree_walk.walk_arrays(
        tree.tokens.to(device),
        tree.parents.to(device),
        torch.tensor([tree.num_nodes], device=device),
        target_choice,
        tree.max_depth,
    )
    n = int(commit_len[0])
    return WalkResult(path=path[:n].tolist(), accepted_tokens=emitted[: n - 1].tolist(), bonus_token=int(bonus[0]))
