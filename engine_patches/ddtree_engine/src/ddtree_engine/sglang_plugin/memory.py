"""The GPU memory a DDTREE verify needs beyond DFLASH's, on hybrid (Gated-DeltaNet) targets.

Pure Python (no torch, no sglang): the worker logs it at startup, the README quotes it, and
tests/ddtree_engine/sglang_worker/test_memory.py checks it on the CPU.

SGLang 0.5.23 keeps, per request slot and per GDN layer, one intermediate recurrent state and one
conv window for every verified row (`MambaPool`, mem_cache/memory_pool.py), so the verify can
commit any row's state. DFLASH verifies `block` rows of a chain and stores the conv windows
deduplicated (consecutive rows share K-2 inputs: `block + K - 2` columns); a tree (topk > 1) keeps
the dense layout (`K - 1` columns per row), and DDTREE verifies `width = nodes + 1` rows. Attention
KV needs nothing extra: SGLang reserves `max(block, width)` slots per step out of the same pool.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class GdnShape:
    """The Gated-DeltaNet dimensions that size the verify states."""

    layers: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_dim: int
    conv_kernel: int

    @classmethod
    def from_hf_config(cls, config: dict) -> "GdnShape | None":
        """From a qwen3_5_text / qwen3_next config.json (None for a target with no GDN layer)."""
        layer_types = config.get("layer_types") or []
        layers = sum(1 for t in layer_types if t == "linear_attention")
        if not layers:
            interval = config.get("full_attention_interval")
            total = config.get("num_hidden_layers") or 0
            if config.get("linear_num_value_heads") and interval:
                layers = total - total // interval
        if not layers:
            return None
        key_heads, value_heads = int(config["linear_num_key_heads"]), int(config["linear_num_value_heads"])
        key_dim, value_dim = int(config["linear_key_head_dim"]), int(config["linear_value_head_dim"])
        return cls(
            layers=layers,
            value_heads=value_heads,
            key_dim=key_dim,
            value_dim=value_dim,
            conv_dim=2 * key_heads * key_dim + value_heads * value_dim,
            conv_kernel=int(config.get("linear_conv_kernel_dim", 4)),
        )


def verify_state_bytes(shape: GdnShape, rows: int, *, dense_conv: bool, ssm_bytes: int = 4, conv_bytes: int = 2) -> dict:
    """Bytes of intermediate verify state per request slot.

    Args:
        shape: the target's GDN dimensions.
        rows: verified rows per request (DFLASH: its block; DDTREE: its verify width).
        dense_conv: the tree layout (K - 1 columns per row) instead of DFLASH's deduplicated one.
        ssm_bytes, conv_bytes: element sizes (SGLang keeps the recurrent state in fp32 and the conv
            windows in the model dtype, bf16).

    Returns:
        {"ssm": bytes, "conv": bytes, "total": bytes}.
    """
    ssm = shape.layers * rows * shape.value_heads * shape.key_dim * shape.value_dim * ssm_bytes
    columns = (shape.conv_kernel - 1) * rows if dense_conv else rows + shape.conv_kernel - 2
    conv = shape.layers * shape.conv_dim * columns * conv_bytes
    return {"ssm": ssm, "conv": conv, "total": ssm + conv}


def extra_over_dflash(shape: GdnShape, width: int, block: int, topk: int, **sizes) -> dict:
    """Per request slot: DDTREE's verify states, DFLASH's at the same block, and the difference.

    Args:
        width: DDTREE's verify width (tree nodes + 1); block: the drafter's block (DFLASH's rows);
        topk: DDTREE's topk (> 1 makes SGLang keep the dense conv layout).

    Returns:
        {"ddtree": bytes, "dflash": bytes, "extra": bytes} per request slot.
    """
    ddtree = verify_state_bytes(shape, max(width, block), dense_conv=topk > 1, **sizes)["total"]
    dflash = verify_state_bytes(shape, block, dense_conv=False, **sizes)["total"]
    return {"ddtree": ddtree, "dflash": dflash, "extra": ddtree - dflash}


def describe(shape: GdnShape, width: int, block: int, topk: int, slots: int) -> str:
    """One log line: the verify states DDTREE holds for `slots` request slots, and DFLASH's."""
    per = extra_over_dflash(shape, width, block, topk)
    return (
        f"DDTREE verify states ({shape.layers} GDN layers, {max(width, block)} rows per request, {slots} request slots): "
        f"{per['ddtree'] * slots / GIB:.2f} GiB ({per['ddtree'] / MIB:.1f} MiB per request); DFLASH at block {block} "
        f"would hold {per['dflash'] * slots / GIB:.2f} GiB: +{per['extra'] * slots / GIB:.2f} GiB for DDTREE"
    )


def shortfall_message(shape: GdnShape, *, budget: int, topk: int, width: int, block: int, slots: int, sglang_message: str) -> str:
    """What a DDTREE server says when its hybrid verify states do not fit (startup, before serving).

    SGLang's own message advises reducing --speculative-num-draft-tokens, which DDTREE sets itself
    from the budget; this one gives DDTREE's numbers and the flags that change them.

    Args:
        shape: the target's GDN dimensions; budget, topk: the DDTREE settings; width: the verify
            rows per request (budget + 1, at least the block); block: the drafter's block;
        slots: request slots SGLang sizes the pool for (--max-running-requests + 1 padding slot);
        sglang_message: SGLang's error, appended for its own figures.
    """
    per = extra_over_dflash(shape, width, block, topk)
    smaller = 15 if budget > 15 else None
    hint = ""
    if smaller is not None:
        at15 = extra_over_dflash(shape, max(smaller + 1, block), block, topk)
        hint = f" (budget {smaller}: {at15['ddtree'] / MIB:.1f} MiB per request)"
    return (
        f"DDTREE budget {budget}, topk {topk} verifies {max(width, block)} rows per request: its hybrid verify states need "
        f"{per['ddtree'] / MIB:.1f} MiB per request slot ({shape.layers} GDN layers; DFLASH at block {block} needs "
        f"{per['dflash'] / MIB:.1f}), {per['ddtree'] * slots / GIB:.2f} GiB for {slots} slots, and they do not fit. "
        f"Lower --speculative-ddtree-budget{hint}, lower --max-running-requests, or raise --mem-fraction-static. "
        f"SGLang said: {sglang_message}"
    )


def tree_step_bytes(depths: int, padded_vocab: int, hidden: int, budget: int, topk: int, rows: int, head_bytes: int = 2) -> dict:
    """Bytes per request slot of the tree step's static buffers (prep.py, walk_commit.py, TreeStep).

    Args:
        depths: L, the drafted depths; padded_vocab: V', the LM head's rows; hidden: H.
        budget: the tree's nodes (N = budget + 1 rows); topk: K (min(topk, budget) candidates per depth).
        rows: C, the verify's rows per request (>= N); head_bytes: the LM head's element size.

    Returns:
        {"draft_logits": bytes, "total": bytes}: the [L, V'] draft logits dominate. The graphs'
        temporaries (the top-K pass's per-block keys, ~L * V' / 4096 * 64 bytes) come on top, once
        for all batch sizes (one shared pool).
    """
    k = max(min(topk, budget), 1)
    n = budget + 1
    words = (n + 31) // 32
    draft_logits = depths * padded_vocab * head_bytes
    tree_step = (
        depths * k * 16  # top-K log-probs (fp64) and ids
        + 5 * n * 8 + 8  # tree: tokens, parents, depths, ranks, scores; num_nodes
        + n * n + n * words * 4 + 3 * n * 8  # compiled: mask, packed mask, positions, first child, next sibling
        + 2 * n * 8 + 16  # walked: path, emitted; commit length, bonus
    )
    prep = depths * hidden * head_bytes + 16 + 5 * rows * 8 + rows * rows  # hidden, root, prefix; rows; block
    walk_commit = 2 * n * 8 + 16 + 2 * rows * 8  # choices, row ids; prefix, request; KV locations, drafter slots
    total = draft_logits + tree_step + prep + walk_commit
    return {"draft_logits": draft_logits, "total": total}


def describe_tree_step(depths: int, padded_vocab: int, hidden: int, budget: int, topk: int, rows: int, head_bytes: int = 2) -> str:
    """One log line: the tree step's buffers per request (the draft logits and hidden states are
    allocated for the largest batch so far; each batch size met adds its own few KiB of index arrays)."""
    per = tree_step_bytes(depths, padded_vocab, hidden, budget, topk, rows, head_bytes)
    return (
        f"DDTREE tree step: {per['total'] / MIB:.2f} MiB per request in a batch ({per['draft_logits'] / MIB:.2f} MiB of it "
        f"the draft logits [{depths}, {padded_vocab}]), allocated for the largest batch so far; its CUDA graphs "
        f"share one memory pool"
    )
