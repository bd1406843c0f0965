"""`--speculative-algorithm DDTREE` for SGLang: the spec class, its startup checks, its resolution.

DDTREE rides SGLang's DFLASH machinery: `DDTreeSpecAlgo` answers `is_dflash()` and
`is_dflash_family()` True, so the scheduler, model runner and KV pools treat it as DFLASH (aux
hidden-state capture for the drafter, draft KV, `DFlashDraftInputV2`), and it borrows DFLASH's
answers for the methods the default `CustomSpecAlgo` lacks. Only the worker differs
(`worker.DDTreeWorker`, imported when SGLang creates it: torch and CUDA live there).

Resolution (SGLang's `handle_speculative_decoding` step, for a registered algorithm):
1. `validate_server_args` -> `check_ddtree_settings`: every flag problem at once, as one
   ValueError that names the flag to change; it reaches the operator through SGLang's own
   resolution error path (`ServerArgs.resolve_once` -> launcher exits).
2. `DDTreeSpecAlgo.handle_server_args`: everything `_handle_dflash` declares (block size, topk 1,
   one step, draft attention backend, max running requests), then the spine-depth check against
   the block, then two declarations of its own:
   - `speculative_num_draft_tokens = max(block_size, budget + 1)`: SGLang reserves this many KV
     slots per request and step, and the tree's verify width is up to budget + 1;
   - `speculative_eagle_topk = topk`: SGLang's hybrid GDN backend walks parent-indexed trees
     (`retrieve_next_token/sibling`) only when topk > 1; at topk = 1 it verifies a chain.
   Declarations are last-writer-wins, so the topk declared here overrides `_handle_dflash`'s 1.
3. Still in `handle_server_args`, a decode step's verify kept to `STEP_MAX_ROWS` rows (`wide_tree_limits`):
   where the verify is wider than `STEP_MAX_ROWS / 48` rows a request, at most `STEP_MAX_ROWS // width`
   requests at once unless the operator set --max-running-requests; where they set more, the decode CUDA graphs'
   batch sizes capped at that many rows (`capped_graph_batch_sizes`) unless they named those too, and larger
   batches run eager.
"""

from __future__ import annotations

import logging

from sglang.srt.arg_groups.arg_utils import is_record
from sglang.srt.arg_groups.overrides import (
    _ForeignDefaults,
    attention_backends_of,
    declare_resolution,
    record_of,
    resolving_view,
)
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from .flags import HYBRID_MODES, cli_flag

ALGORITHM = "DDTREE"
logger = logging.getLogger(__name__)

# The most verify rows (batch size x rows a request) of one DDTREE decode step by default. SGLang 0.5.23's tree verify of
# a Gated-DeltaNet layer (fused_sigmoid_gating_delta_rule_update with retrieve_parent_token) holds a vector of
# next_power_of_2(the batch's verify rows) parent indices in every program (a constexpr: one compile per size) and
# reduces over it once per token. At DFLASH's settings (48 requests at once) that is 48 x 16 = 768 rows, 1,024 wide;
# at budget 128, 48 x 129 = 6,192 rows, 8,192 wide. On the H200 (2026-12-05, lab pair,
# benchmarks/results/sglang_h200_wide_2026-12-05.json) capturing that first batch size's CUDA graph took 172 s of the
# server's start (that kernel's compile and runs at 8,192, read from SGLang's source; the log names no kernel).
# 2,048 rows keep it at most 2,048 wide: budgets up to 41 (42 rows) keep DFLASH's 48 requests; budget 128 runs 15 at
# once, 256 runs 7. A verify that wide is compute-bound long before (a 4B target over 2,048 rows is a prefill
# chunk), so the cap costs little throughput. It does not bound the other wide compile: SGLang's tree causal-conv1d
# update (_causal_conv1d_update_kernel) unrolls a loop over one request's verify rows; on an H100 (2026-12-05,
# sglang_h100_wide*_2026-12-05.json) it compiled for 166 s at 129 rows and had not finished after 400 s at 257.
# Deploy keeps each service's Triton cache across restarts (ddtree_ops deploy/units.py default_env).
STEP_MAX_ROWS = 2048

# Attention backends whose target-verify path applies an arbitrary per-request tree mask
# (`spec_info.custom_mask`, ancestor-only) at page size 1. triton is the one run on the H200.
TREE_MASK_ATTENTION_BACKENDS = ("triton",)
# Named in the refusal so an operator sees why their usual backend is refused. Any other backend
# is refused as not validated with a DDTREE tree mask.
NO_TREE_MASK_ATTENTION_BACKENDS = {
    "trtllm_mha": "it needs speculative topk 1 and page size > 1, i.e. a causal chain",
    "fa3": "its topk > 1 verify reads EAGLE's tree layout, not validated with DDTREE's mask",
    "flashinfer": "its custom-mask verify is not validated with DDTREE",
}


def _record_behind(server_args):
    """The ServerArgs record behind SGLang's stand-in for a plugin callback.

    `handle_speculative_decoding` hands a registered algorithm's `handle_server_args` a
    `_ForeignDefaults` stand-in (it reads through the resolving view and records attribute
    writes). `_handle_dflash` declares with `declare_resolution`, which must see the record itself
    (SGLang's own dispatcher gets the record for that reason), so the stand-in is unwrapped.
    """
    if isinstance(server_args, _ForeignDefaults):
        return record_of(object.__getattribute__(server_args, "_cfg"))
    return server_args


def check_ddtree_settings(server_args) -> None:
    """Refuse DDTREE settings no SGLang 0.5.23 run supports, naming what to change.

    Args:
        server_args: the ServerArgs record, a resolving view of it, or SGLang's stand-in.

    Raises:
        ValueError: one message listing every problem found (budget, topk, spine depth against
            the budget, hybrid mode, attention backend, page size, overlap schedule).
    """
    cfg = server_args if not is_record(server_args) else resolving_view(server_args)
    problems = []
    budget = cfg.speculative_ddtree_budget
    topk = cfg.speculative_ddtree_topk
    spine = cfg.speculative_ddtree_spine_depth
    if budget < 1:
        problems.append(
            f"{cli_flag('speculative_ddtree_budget')} must be >= 1 (drafted tree nodes per "
            f"verify step), got {budget}"
        )
    if topk < 1:
        problems.append(
            f"{cli_flag('speculative_ddtree_topk')} must be >= 1 (candidates per depth), got {topk}"
        )
    if spine < 0 or (budget >= 1 and spine > budget):
        problems.append(
            f"{cli_flag('speculative_ddtree_spine_depth')} must be between 0 and the budget "
            f"({budget}): a spine of depth d uses d of the tree's nodes; got {spine}"
        )
    mode = cfg.speculative_ddtree_hybrid_mode
    if mode not in HYBRID_MODES:
        problems.append(
            f"{cli_flag('speculative_ddtree_hybrid_mode')} must be one of {', '.join(HYBRID_MODES)}, "
            f"got {mode!r}"
        )
    elif mode == "unsafe" and not cfg.speculative_ddtree_allow_hybrid_unsafe:
        problems.append(
            f"{cli_flag('speculative_ddtree_hybrid_mode')} unsafe reproduces sibling state leakage "
            "and corrupts output on hybrid models: use safe (or spine), or add "
            f"{cli_flag('speculative_ddtree_allow_hybrid_unsafe')} to run it for diagnosis"
        )
    prefill_backend, decode_backend = attention_backends_of(cfg)
    named = [("prefill", prefill_backend), ("decode", decode_backend)]
    if prefill_backend == decode_backend:
        named = [("", prefill_backend)]
    for which, backend in named:
        if backend not in TREE_MASK_ATTENTION_BACKENDS:
            why = NO_TREE_MASK_ATTENTION_BACKENDS.get(backend, "not validated with a DDTREE tree mask")
            shown = "unset" if backend is None else repr(backend)
            problems.append(
                f"the {which + ' ' if which else ''}attention backend is {shown}: DDTREE verifies a tree through a custom "
                f"ancestor mask, which {', '.join(TREE_MASK_ATTENTION_BACKENDS)} supports"
                + ("" if backend is None else f" and {backend} does not ({why})")
                + f"; set --{which + '-' if which else ''}attention-backend triton"
            )
    if cfg.page_size not in (None, 1):
        problems.append(
            f"--page-size is {cfg.page_size}: the tree's KV slots are kept or dropped one token at "
            "a time; set --page-size 1"
        )
    if not cfg.disable_overlap_schedule:
        problems.append(
            "the overlap schedule is on: the DDTREE worker runs synchronously; add "
            "--disable-overlap-schedule"
        )
    # CUDA graphs are allowed: the worker captures the target's verify with the tree mask
    # (graph_runner.py), pads each tree to the captured width (padding.py), and captures the
    # drafter's at its block where SGLang would capture them at the verify's width (worker.init_cuda_graphs).
    if problems:
        raise ValueError(f"{ALGORITHM} cannot start with these settings:" + "".join(f"\n- {p}" for p in problems))


def requests_per_step(width: int, max_rows: int = STEP_MAX_ROWS) -> int:
    """The most requests of `width` verify rows each whose decode step holds at most `max_rows` rows (at least 1)."""
    return max(1, max_rows // width)


def wide_tree_limits(record, width: int, max_rows: int = STEP_MAX_ROWS) -> dict:
    """What a verify of `width` rows a request declares so a decode step holds at most `max_rows` rows (module doc).

    Args:
        record: the ServerArgs record, DFLASH's declarations made (its max_running_requests among them).
        width: verify rows a request, max(block, budget + 1).
        max_rows: the most rows of one decode step by default.

    Returns:
        {} where nothing changes; {"max_running_requests": max_rows // width} where the operator did not set
        --max-running-requests and SGLang would run more; {"cuda_graph_config": ...} where they did, more, and did
        not name the decode graphs' batch sizes (capped_graph_batch_sizes). Each change is logged.
    """
    cfg = resolving_view(record)
    cap = requests_per_step(width, max_rows)
    running = cfg.max_running_requests
    if record.max_running_requests is None and running is not None and running > cap:
        logger.info(
            "DDTREE: at most %d requests at once (%d verify rows a request, at most %d a step: a wider step is "
            "compute-bound, and SGLang's tree verify of a Gated-DeltaNet layer grows with it); --max-running-requests "
            "sets another number",
            cap, width, max_rows,
        )
        return {"max_running_requests": cap}
    config = capped_graph_batch_sizes(cfg.cuda_graph_config, getattr(record, "_cuda_graph_config_locked", set()), width,
                                      running, max_rows)
    if config is None:
        return {}
    logger.info(
        "DDTREE: decode CUDA graphs for batch sizes %s only (at most %d verify rows a graph, %d rows a request); "
        "larger batches run eager. --cuda-graph-max-bs-decode sets them yourself.",
        config.decode.bs, max_rows, width,
    )
    return {"cuda_graph_config": config}


def capped_graph_batch_sizes(config, locked, width: int, max_running: int | None = None, max_rows: int = STEP_MAX_ROWS):
    """The CUDA-graph config with the decode graphs' batch sizes capped at `max_rows` verify rows, or None
    where nothing changes.

    Args:
        config: SGLang's resolved CudaGraphConfig (None before it is resolved).
        locked: the (phase, key) pairs the operator set (SGLang's `_cuda_graph_config_locked`).
        width: verify rows a request (max(block, budget + 1)).
        max_running: the running-request cap (SGLang captures no batch size above it), or None.
        max_rows: the most rows a graph may hold.

    Returns:
        A copy of `config` whose decode phase keeps the batch sizes of at most max_rows // width requests
        (and that number itself, SGLang's way of always capturing its max_bs), or None: graphs off, no decode
        batch sizes resolved yet, the operator set them, or none SGLang would capture is over the cap.
    """
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase

    if config is None or config.decode.backend == Backend.DISABLED or not config.decode.bs:
        return None
    if {(Phase.DECODE, "bs"), (Phase.DECODE, "max_bs")} & set(locked):
        return None
    cap = requests_per_step(width, max_rows)
    if min(max(config.decode.bs), max_running or max(config.decode.bs)) <= cap:
        return None
    kept = sorted({bs for bs in config.decode.bs if bs <= cap} | {cap})
    return with_phase(config, Phase.DECODE, bs=kept, max_bs=kept[-1])


def _ddtree_worker_class(server_args):
    """SGLang's worker factory: import the worker only when a scheduler creates it."""
    from .worker import DDTreeWorker

    return DDTreeWorker


class DDTreeSpecAlgo(CustomSpecAlgo):
    """DDTREE as SGLang sees it: DFLASH's family and answers, DDTREE's worker and resolution."""

    def is_dflash(self) -> bool:
        return True

    def is_dflash_family(self) -> bool:
        return True

    # DFLASH's own implementations, evaluated against this class's predicates (is_dflash_family
    # True, is_eagle/is_standalone/is_ngram/is_none False), so they answer as they do for DFLASH.
    # The first four are the ones the default CustomSpecAlgo lacks and the scheduler calls.
    carries_draft_hidden_states = SpeculativeAlgorithm.carries_draft_hidden_states
    create_future_map = SpeculativeAlgorithm.create_future_map
    need_topk = SpeculativeAlgorithm.need_topk
    get_platform_worker_cls = SpeculativeAlgorithm.get_platform_worker_cls
    # The DFlash drafter runs its block as a TARGET_VERIFY forward (CUDA-graph capture asserts it).
    supports_target_verify_for_draft = SpeculativeAlgorithm.supports_target_verify_for_draft
    supports_prefill_shared_read_done = SpeculativeAlgorithm.supports_prefill_shared_read_done
    has_draft_kv = SpeculativeAlgorithm.has_draft_kv
    # Deliberately not DFLASH's: supports_mixed_chunk and supports_grammar_overlap stay False
    # (CustomSpecAlgo's): the DDTREE step neither mixes prefill into verify nor advances a
    # grammar FSM inside verify.

    def handle_server_args(self, server_args) -> None:
        """Resolve DDTREE's settings: DFLASH's, then the verify reserve and topk (module doc).

        Args:
            server_args: SGLang's stand-in for the record (or the record itself).

        Raises:
            ValueError: from `_handle_dflash` (e.g. no --speculative-draft-model-path), or a
                spine depth past the drafter's block.
        """
        from sglang.srt.arg_groups.speculative_hook import _handle_dflash
        from sglang.srt.speculative.ragged_verify import read_ragged_verify_mode

        record = _record_behind(server_args)
        # SGLang's built-in dispatcher validates this env for every algorithm; do the same.
        read_ragged_verify_mode()
        try:
            _handle_dflash(record)
        except ValueError as exc:
            raise ValueError(f"{ALGORITHM} runs SGLang's DFLASH drafter and cannot start: {exc}") from exc
        cfg = resolving_view(record)
        block_size = int(cfg.speculative_num_draft_tokens)
        depths = block_size - 1
        spine = cfg.speculative_ddtree_spine_depth
        if spine > depths:
            raise ValueError(
                f"{ALGORITHM} cannot start with these settings:\n- "
                f"{cli_flag('speculative_ddtree_spine_depth')} {spine} is deeper than the tree: the "
                f"drafter's block {block_size} drafts {depths} depths; use at most {depths}"
            )
        width = max(block_size, int(cfg.speculative_ddtree_budget) + 1)
        declare_resolution(
            record,
            "DDTreeSpecAlgo.handle_server_args",
            speculative_num_draft_tokens=width,
            speculative_eagle_topk=int(cfg.speculative_ddtree_topk),
        )
        limits = wide_tree_limits(record, width)
        if limits:
            declare_resolution(record, "DDTreeSpecAlgo.handle_server_args", **limits)

    def create_worker(self, server_args):
        """The worker class, after the one check SGLang would otherwise word less helpfully."""
        if not resolving_view(_record_behind(server_args)).disable_overlap_schedule:
            raise ValueError(f"{ALGORITHM} does not support overlap scheduling: add --disable-overlap-schedule.")
        # The scheduler asks for the worker before it sizes the memory pools: from here on, a budget
        # whose hybrid verify states do not fit fails with DDTREE's number (fit.py).
        from .fit import install

        install()
        return super().create_worker(server_args)


def register_algorithm() -> None:
    """Register DDTREE with SGLang's speculative registry (once: SGLang refuses a second)."""
    SpeculativeAlgorithm.register(
        ALGORITHM,
        supports_overlap=False,
        validate_server_args=check_ddtree_settings,
        spec_class=DDTreeSpecAlgo,
    )(_ddtree_worker_class)
