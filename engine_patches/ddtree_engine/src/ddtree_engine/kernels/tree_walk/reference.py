"""Reference: the verify walk over a fixed-shape tree, with the kernel's fixed-shape outputs."""

from __future__ import annotations

import torch


def walk_arrays(
    tokens: torch.Tensor, parents: torch.Tensor, num_nodes: int, target_choice: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Follow the target's choice from the root: at each node, move to the child whose token
    is the target's choice there (the first such child in index order), until none is.

    Args:
        tokens, parents: [N] the tree (padding from `num_nodes` on is ignored).
        num_nodes: real nodes.
        target_choice: [N] the target's token at every node.

    Returns:
        (path [N] int64: accepted node indices from the root, then -1; emitted [N] int64: the
        accepted drafts' tokens then the bonus token, then -1; commit_len [1] int64: accepted
        drafts + 1; bonus [1] int64: the target's choice at the last accepted node).
    """
    n_out = tokens.shape[0]
    toks, pars, choice = tokens.tolist(), parents.tolist(), target_choice.tolist()
    node, path = 0, [0]
    while True:
        want = choice[node]
        child = next((i for i in range(1, num_nodes) if pars[i] == node and toks[i] == want), -1)
        if child < 0:
            break
        node = child
        path.append(node)
    emitted = [toks[i] for i in path[1:]] + [choice[node]]
    long = dict(dtype=torch.long)
    return (
        torch.tensor(path + [-1] * (n_out - len(path)), **long),
        torch.tensor(emitted + [-1] * (n_out - len(emitted)), **long),
        torch.tensor([len(path)], **long),
        torch.tensor([choice[node]], **long),
    )
