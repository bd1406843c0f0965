"""A DDTREE verify padded to the width SGLang captured its CUDA graphs at.

Pure torch (no sglang), so it is tested on the CPU: tests/ddtree_engine/sglang_worker/test_padding.py.

SGLang captures its target-verify graphs with `captured_req_width` rows per request
(`speculative_num_draft_tokens`, which `spec.DDTreeSpecAlgo.handle_server_args` declares as
max(block, budget + 1)), and replays one only for a batch of exactly that width. A DDTREE tree
has W = min(budget, max tree nodes) + 1 rows, often fewer (budget 8, block 16: 9 against 16).
So, where a graph can replay, the tree is padded to the captured width C with rows that change
nothing:
- a pad row attends to the prefix and to itself, and no tree row attends to a pad row;
- a pad row is nobody's first child or next sibling (SGLang's GDN / conv kernels then give it
  the root as parent: its recurrent state is computed and never committed);
- the walk, the commit and the output read rows 0 .. W - 1 only, so no pad row is accepted;
- its KV goes to the window slots prefix + W .. prefix + C - 1, which SGLang reserved for the
  step (C slots per request) and which the commit leaves in place, dead, like a rejected node's.
"""

from __future__ import annotations

import torch

from ..kernels.tree_mask.reference import flat_custom_mask  # the flat layout; prep.py takes it from here


def verify_rows(width: int, captured_width: int | None, bs: int, max_graph_bs: int | None, reserve: int) -> int:
    """How many rows per request to verify: the captured width where a graph can replay, else W.

    Args:
        width: W, the tree's rows (root + nodes).
        captured_width: the target graph runner's `captured_req_width`, None without graphs.
        bs: requests in this step.
        max_graph_bs: the largest batch the runner captured, None without graphs.
        reserve: the KV slots SGLang reserves per request and step (pad rows write KV too).

    Returns:
        `captured_width` when graphs exist, the batch fits them and W <= C <= reserve; W
        otherwise (an eager verify gains nothing from pad rows).
    """
    if captured_width is None or max_graph_bs is None or bs > max_graph_bs:
        return width
    if not width <= captured_width <= reserve:
        return width
    return int(captured_width)


def pad_tree(
    tokens: torch.Tensor, depths: torch.Tensor, first_child: torch.Tensor, next_sibling: torch.Tensor, rows: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tree's per-row arrays padded from W to `rows` columns.

    Args:
        tokens, depths, first_child, next_sibling: [bs, W] each (links -1 for none).
        rows: C >= W.

    Returns:
        (tokens, depths, first_child, next_sibling), [bs, C] each: pad rows carry the root's
        token at depth 0 (position = prefix, like the root) and links -1; the first W columns
        are the inputs unchanged (no tree row links to a pad row).
    """
    bs, width = tokens.shape
    if rows < width:
        raise ValueError(f"expected rows >= the tree's width {width}, got {rows}")
    if rows == width:
        return tokens, depths, first_child, next_sibling
    extra = rows - width
    pad_tokens = tokens[:, :1].expand(bs, extra)
    pad_depths = torch.zeros((bs, extra), dtype=depths.dtype, device=depths.device)
    no_link = torch.full((bs, extra), -1, dtype=first_child.dtype, device=first_child.device)
    return (
        torch.cat([tokens, pad_tokens], dim=1),
        torch.cat([depths, pad_depths], dim=1),
        torch.cat([first_child, no_link], dim=1),
        torch.cat([next_sibling, no_link.to(next_sibling.dtype)], dim=1),
    )


def tree_custom_mask(masks: list[torch.Tensor], prefix_lens: list[int], rows: int) -> torch.Tensor:
    """SGLang's TARGET_VERIFY custom mask for a batch of trees, each padded to `rows` rows.

    Args:
        masks: per request, the tree's [W, W] bool ancestor mask (True = may attend).
        prefix_lens: per request, the committed prefix length (host ints).
        rows: C >= W, the rows verified per request.

    Returns:
        The flat bool mask SGLang's backends read: per request a row-major [C, prefix + C] block
        (`mask_indptr` steps by C * (prefix + C)). Tree rows see the whole prefix and their
        ancestors; pad rows see the whole prefix and themselves; nobody sees a pad row.
    """
    blocks = []
    for mask in masks:
        width = mask.shape[0]
        if rows < width:
            raise ValueError(f"expected rows >= the tree's width {width}, got {rows}")
        block = torch.zeros((rows, rows), dtype=torch.bool, device=mask.device)
        block[:width, :width] = mask
        pad = torch.arange(width, rows, device=mask.device)
        block[pad, pad] = True
        blocks.append(block)
    return flat_custom_mask(blocks, prefix_lens)
