"""A DDTREE budget whose hybrid verify states do not fit fails at startup with DDTREE's number.

SGLang 0.5.23 sizes its mamba pool in `KVCacheConfigurator._handle_max_mamba_cache` and raises
"Not enough GPU memory for hybrid (mamba/linear-attention) state cache" when no request slot fits,
advising to reduce --speculative-num-draft-tokens (which DDTREE derives from its budget). `install()`
wraps that method in the scheduler process, from `DDTreeSpecAlgo.create_worker`, which SGLang calls
before it allocates the pools (`Scheduler.init_model_worker`: draft worker, then memory pools). The
module is not hooked at plugin load: importing it there would pull SGLang's model stack into every
process. For DDTREE the wrapper re-raises with the per-request figure of `memory.shortfall_message`
and the flags that change it; every other error passes through untouched. When SGLang's sizing
returns no memory left for the KV cache from a positive rest and the per-row verify states are what
took it there (the path with --max-running-requests set, which raises nothing itself and lets its
caller blame the weights), the wrapper raises DDTREE's message there too.
"""

from __future__ import annotations

SHORTFALL = "Not enough GPU memory for hybrid"
# With --max-running-requests set and the radix cache off (how DDTREE serves), SGLang sizes the mamba pool
# from the request count and subtracts the verify's per-row states without checking them: the rest goes
# negative and its caller blames the weights ("Loaded weights leave no GPU memory for the KV cache ...").
LEFT_NOTHING = "Loaded weights leave no GPU memory for the KV cache"
TARGET = ("sglang.srt.mem_cache.kv_cache_configurator", "KVCacheConfigurator", "_handle_max_mamba_cache")


def install() -> bool:
    """Wrap the pool sizing method once per process; True when this call wrapped it."""
    import functools
    import importlib

    module_name, class_name, method = TARGET
    cls = getattr(importlib.import_module(module_name), class_name)
    original = getattr(cls, method)
    if getattr(original, "_ddtree_wrapped", False):
        return False

    @functools.wraps(original)
    def wrapped(configurator, *args, **kwargs):
        return explain_mamba_shortfall(original, configurator, *args, **kwargs)

    wrapped._ddtree_wrapped = True
    setattr(cls, method, wrapped)
    return True


def explain_mamba_shortfall(original, configurator, *args, message_for=None, verify_gb_for=None, **kwargs):
    """Call SGLang's pool sizing; turn its hybrid-state shortfall into DDTREE's message (module doc).

    Args:
        original: `KVCacheConfigurator._handle_max_mamba_cache`; configurator: its instance.
        message_for: (configurator, sglang_message) -> message or None; `ddtree_message` by default.
        verify_gb_for: (configurator) -> GB of per-row verify states SGLang subtracted; `verify_states_gb`
            by default. DDTREE's message replaces a rest left <= 0 only when these states are what took
            it there: a pool that the weights, or the persistent states alone, leave no room for is
            SGLang's to report (a smaller budget would not help).
    """
    try:
        rest = original(configurator, *args, **kwargs)
    except RuntimeError as exc:
        if SHORTFALL not in str(exc):
            raise
        message = (message_for or ddtree_message)(configurator, str(exc))
        if message is None:
            raise
        raise RuntimeError(message) from exc
    before = args[0] if args else kwargs.get("total_rest_memory")
    if isinstance(before, (int, float)) and isinstance(rest, (int, float)) and before > 0 >= rest:
        verify = (verify_gb_for or verify_states_gb)(configurator)
        if rest + verify > 0:
            # Not SGLang's words: its caller would say the weights leave no memory (LEFT_NOTHING).
            said = (f"its pool sizing left {rest:.2f} GB for the KV cache: of the {before:.2f} GB after the weights, "
                    f"the hybrid states take {before - rest:.2f} GB, {verify:.2f} GB of it the per-row verify states")
            message = (message_for or ddtree_message)(configurator, said)
            if message is not None:
                raise RuntimeError(message)
    return rest


def verify_states_gb(configurator) -> float:
    """GB of per-row verify states SGLang 0.5.23 subtracts in `_handle_max_mamba_cache` after it ran.

    Its reservation: mamba_cache_per_req x (request slots + 1) x speculative_num_draft_tokens, the
    slots min(max_running_requests, max_mamba_cache_size); none under ReplaySSM. 0.0 where a name
    is missing (another release): then no rest is blamed on DDTREE.
    """
    try:
        from sglang.srt.runtime_context import get_exec, get_schedule, get_spec

        if get_exec().mamba.enable_linear_replayssm_spec:
            return 0.0
        per_req = configurator.mambaish_config.mamba2_cache_params.mamba_cache_per_req
        schedule = get_schedule()
        slots = min(int(schedule.max_running_requests or 1), int(schedule.max_mamba_cache_size)) + 1
        return float(per_req) * slots * int(get_spec().speculative_num_draft_tokens) / (1 << 30)
    except (AttributeError, ImportError, TypeError, ValueError):
        return 0.0


def drafter_block(draft_path) -> int:
    """The drafter's block size from its config.json (16, SGLang's DFLASH default, when unreadable)."""
    import json
    from pathlib import Path

    try:
        config = json.loads((Path(draft_path) / "config.json").read_text())
    except (TypeError, OSError, ValueError):
        return 16
    block = config.get("block_size") or (config.get("dflash_config") or {}).get("block_size")
    return int(block) if block else 16


def ddtree_message(configurator, sglang_message: str) -> str | None:
    """DDTREE's shortfall message for this server, or None when it is not a DDTREE hybrid server."""
    from sglang.srt.runtime_context import get_schedule, get_spec

    from .memory import GdnShape, shortfall_message
    from .spec import ALGORITHM

    spec = get_spec()
    if str(getattr(spec, "speculative_algorithm", "") or "").upper() != ALGORITHM:
        return None
    shape = GdnShape.from_hf_config(configurator.model_config.hf_text_config.to_dict())
    if shape is None:
        return None
    budget, topk = int(spec.speculative_ddtree_budget), int(spec.speculative_ddtree_topk)
    width = int(spec.speculative_num_draft_tokens)  # max(block, budget + 1), as spec.py declares
    block = drafter_block(getattr(spec, "speculative_draft_model_path", None))
    slots = max(1, int(get_schedule().max_running_requests or 1)) + 1
    return shortfall_message(shape, budget=budget, topk=topk, width=width, block=block, slots=slots,
                             sglang_message=sglang_message)
