"""DDTREE's hybrid verify conv through the engine's kernel instead of SGLang's tree path (on by default).

SGLang 0.5.23's Gated-DeltaNet backend (`gdn_backend`) runs every target-verify conv through
`causal_conv1d_update`, whose tree path (`retrieve_next_token` given) unrolls a loop over one request's
verify rows: minutes of compile at budget >= 128 on a hybrid target's first start, one compile per width
(benchmarks/sglang_conv_compile.py). `install()` replaces the name in `gdn_backend` with `router(original)`,
which sends the tree calls to kernels/tree_conv_update (the same arrays, bit for bit against SGLang's kernel
in tests/ddtree_engine/sglang_plugin/test_tree_conv_update.py; one compile for every width) and every other
call, unchanged, to SGLang's; with PARENTS_ONCE it also wraps `GDNAttnBackend.forward_extend`, at class level for
every backend of the process, in `layer_scope`, so that the router knows which layer calls it.

On by default for a DDTREE server on a hybrid target (the worker installs it in the process that runs the
target); `DDTREE_SGLANG_TREE_CONV=0` keeps SGLang's. On an H100 on 2026-12-06 (benchmarks/results/
conv_verify_kernel_20261206_h100.json, sglang_h100_treeconv_2026-12-06.json): SGLang's arrays bit for bit in bf16
on 12 shapes, 0.67-0.78x SGLang's time per launch at 16 rows and 0.49-0.57x at 33; in SGLang the lab pair's
DDTREE 15/8 (graphs, eager, batched), 128/8 and 256/8 equal AR on 8 of 8 prompts, and 128/8 and 256/8 load in
~64 s against 256 s and over 500 s with SGLang's conv. Since 2026-12-06 the parents are found once a forward, by
the first Gated-DeltaNet layer (PARENTS_ONCE, router's parents_once): on the H200 1.14-1.22x the chain conv a launch
at 16 rows, against 1.27-1.37x with every layer finding them.
"""

from __future__ import annotations

import contextvars
import importlib
import logging
import sys

from .prep import env_switch

logger = logging.getLogger(__name__)

ENV = "DDTREE_SGLANG_TREE_CONV"
TARGET = ("sglang.srt.layers.attention.linear.gdn_backend", "causal_conv1d_update")
# The class whose forward_extend runs every Gated-DeltaNet layer's verify conv, in gdn_backend.
BACKEND = "GDNAttnBackend"
# The layer whose forward_extend is running in this thread (layer_scope), for the router.
_LAYER: contextvars.ContextVar = contextvars.ContextVar("ddtree_gdn_layer", default=None)
# Parents once a forward (router's parents_once) in what install() sets up. On the H200 on 2026-12-06
# (benchmarks/results/conv_verify_kernel_20261206_h200.json, `once` arm; 24 layers in a CUDA graph): SGLang's arrays
# bit for bit over the whole forward on 12 shapes, 1.14-1.22x the chain conv a launch at 16 rows against 1.27-1.37x
# with every layer finding its parents, 0.98-1.04x at 33; in SGLang with it (sglang_h200_parents_once_2026-12-06.json)
# the lab pair's DDTREE 15/8 with graphs, eager and batched equal AR on 8 of 8 prompts.
PARENTS_ONCE = True


def enabled() -> bool:
    """Whether DDTREE_SGLANG_TREE_CONV is on (on unless 0/false/no/off)."""
    return env_switch(ENV, default=True)


def layer_scope(forward_extend):
    """GDNAttnBackend.forward_extend that tells the router which layer it runs (its `layer.layer_id`)."""

    def scoped(self, *args, **kwargs):
        layer = kwargs["layer"] if "layer" in kwargs else (args[0] if args else None)
        token = _LAYER.set(getattr(layer, "layer_id", None))
        try:
            return forward_extend(self, *args, **kwargs)
        finally:
            _LAYER.reset(token)

    scoped.original = forward_extend
    return scoped


def router(original, parents_once: bool = False):
    """`original` (SGLang's causal_conv1d_update) with its tree calls served by kernels/tree_conv_update.

    A tree call: `retrieve_next_token` given, no circular buffer (`cache_seqlens`) and no
    `num_accept_tokens` (SGLang's verify passes neither), x [batch, dim, rows]. `routed.engine_calls`
    counts the calls the engine's kernel served, `routed.given_calls` those of them that took the parents given.

    parents_once: SGLang's backend hands every layer of one verify forward the same links and the same
    `retrieve_parent_token`, and its conv kernel finds the parents again in every layer. With this, the first
    Gated-DeltaNet layer (the lowest `layer_id` seen, layer_scope) finds them and writes them there; the others, which
    run after it in the same forward, take them as given (tree_conv_update's parents_given), saving the parent
    phase's round trips in every later layer. A call outside layer_scope always finds them itself, and so does every
    layer when SGLang runs its GDN layers through another class's forward_extend than the one install() scopes.
    """
    # The kernel itself, not the package's dispatcher: these are CUDA tensors inside a graph capture, where the
    # reference (host loops, .tolist()) cannot run, whatever DDTREE_KERNELS says.
    from ..kernels.tree_conv_update.kernel import tree_conv_update

    try:
        from sglang.kernels.ops.mamba.causal_conv1d_triton import PAD_SLOT_ID, is_arch_support_pdl
    except ImportError:  # a release that moved them: the version check refuses it before this runs
        PAD_SLOT_ID, is_arch_support_pdl = -1, lambda: False

    def routed(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None, conv_state_indices=None,
               num_accept_tokens=None, intermediate_conv_window=None, intermediate_state_indices=None,
               retrieve_next_token=None, retrieve_next_sibling=None, retrieve_parent_token=None,
               pad_slot_id=PAD_SLOT_ID, metadata=None, validate_data=False):
        tree = (retrieve_next_token is not None and retrieve_next_sibling is not None
                and retrieve_parent_token is not None and cache_seqlens is None and num_accept_tokens is None
                and x.dim() == 3)
        if not tree:
            return original(x, conv_state, weight, bias, activation, cache_seqlens, conv_state_indices,
                            num_accept_tokens, intermediate_conv_window, intermediate_state_indices,
                            retrieve_next_token, retrieve_next_sibling, retrieve_parent_token, pad_slot_id,
                            metadata, validate_data)
        routed.engine_calls += 1
        layer = _LAYER.get() if parents_once else None
        if layer is not None and (routed.first_layer is None or layer < routed.first_layer):
            if routed.first_layer is not None:  # not in SGLang's forwards, where the lowest layer runs first
                logger.warning("DDTREE: a Gated-DeltaNet layer %d below the first seen (%d) ran a tree verify conv: "
                               "it finds the parents from now on", layer, routed.first_layer)
            routed.first_layer = layer
        given = layer is not None and layer != routed.first_layer
        routed.given_calls += given
        silu = activation is True or activation in ("silu", "swish")
        # PDL exactly where SGLang's own conv kernel takes it (its is_arch_support_pdl), not by DDTREE_PDL: the
        # kernels around this launch in SGLang's verify are SGLang's.
        return tree_conv_update(x, conv_state, weight, bias, silu, conv_state_indices, intermediate_conv_window,
                                intermediate_state_indices, retrieve_next_token, retrieve_next_sibling,
                                retrieve_parent_token, pad_slot_id, pdl=x.is_cuda and bool(is_arch_support_pdl()),
                                parents_given=given)

    routed.engine_calls = 0
    routed.given_calls = 0
    routed.parents_once = parents_once
    routed.first_layer = None
    routed.original = original
    return routed


def counters() -> dict | None:
    """This process's routed tree conv calls (DDTREE_TRACE records them): `engine_calls`, `given_calls` (those that took
    the parents given), `first_layer` and `parents_once` of the router install() put in gdn_backend; None where it has
    not (the switch off, another conv, gdn_backend not imported). Python calls: under CUDA graphs, those of the
    captures (a replay runs the captured kernels without calling the router)."""
    module = sys.modules.get(TARGET[0])
    routed = getattr(module, TARGET[1], None) if module is not None else None
    if getattr(routed, "original", None) is None:
        return None
    return {"engine_calls": routed.engine_calls, "given_calls": routed.given_calls, "first_layer": routed.first_layer,
            "parents_once": routed.parents_once}


def install() -> bool:
    """Route `gdn_backend`'s tree verify conv through the engine's kernel in this process (once).

    Returns:
        True when installed by this call or before; False when the switch is off, or when the name is not SGLang's
        Triton conv (an NPU or CPU build of gdn_backend binds its own, which the kernel cannot serve).
    """
    if not enabled():
        return False
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update as triton_update

    module = importlib.import_module(TARGET[0])
    current = getattr(module, TARGET[1])
    if getattr(current, "original", None) is None and current is not triton_update:
        logger.info("DDTREE: gdn_backend's conv update is not SGLang's Triton one (%s): left as it is",
                    getattr(current, "__module__", current))
        return False
    if getattr(current, "original", None) is None:
        setattr(module, TARGET[1], router(current, parents_once=PARENTS_ONCE))
        backend = getattr(module, BACKEND, None)  # without it, every call finds its parents itself
        if PARENTS_ONCE and backend is not None and getattr(backend.forward_extend, "original", None) is None:
            backend.forward_extend = layer_scope(backend.forward_extend)
        logger.info("DDTREE: the hybrid verify's tree conv runs kernels/tree_conv_update%s (%s=0: SGLang's)",
                    ", parents once a forward" if PARENTS_ONCE else "", ENV)
    return True
