"""The DDTREE decode step inside SGLang 0.5.23, on top of its DFLASH worker.

Prefill, idle batches and the drafter's KV stay DFLASH's (`DFlashWorkerV2`): this class only
replaces the decode step. One step, per request:

1. Draft: DFLASH's block (the bonus token, then mask tokens) through the drafter; its hidden
   states at depths 1..L go through the target's LM head into draft logits [L, V].
2. Tree: this project's TreeStep (top-K log-probs, best-first build of `budget` prefixes,
   ancestor mask, first-child / next-sibling links) on the device, with the LM head before it and
   the verify's padded rows after it: one CUDA-graph replay per batch size when graphs are on
   (prep.py), not ~30 launches a request while the GPU waits for the verify.
3. Verify: the target runs the W = nodes + 1 tree rows in TARGET_VERIFY mode with the tree as
   its custom attention mask (the prefix fully visible) and, on hybrid models, with the
   first-child / next-sibling links SGLang's GDN kernels use to take every node's conv window
   and recurrent state from its parent (`speculative_eagle_topk` > 1 turns that path on). The
   `unsafe` hybrid mode passes links of the flattened order instead (each row the previous row's
   child): the sibling leakage it exists to reproduce.
4. Walk: the target's argmax per node (T = 0) walks the tree: accepted nodes, bonus token.
5. Commit: the request's req_to_token window is permuted so the accepted nodes' KV slots sit at
   positions prefix .. prefix + commit_len - 1 (the slot set is unchanged, so the allocator's
   reservation stays exact); the drafter's context KV is written from the accepted nodes'
   target hidden states; the hybrid layers commit the last accepted node's intermediate state.

CUDA graphs: SGLang captures the target's verify `speculative_num_draft_tokens` rows wide
(max(block, budget + 1)) with the tree mask (graph_runner.py); where a graph can replay, the
tree is padded to that width with inert rows (padding.py) and SGLang replays it (the same
`prepare_for_verify` -> `can_run_graph` path DFLASH's verify takes); otherwise it runs eager at
the tree's own width. The drafter replays its graphs when they were captured at its block width
(budget + 1 <= block); for wider budgets `init_cuda_graphs` captures them at the block under a
scoped spec override (DDTREE_DRAFT_GRAPH_AT_BLOCK=0 runs the drafter eager there instead).

Supported here: greedy requests, tp 1, no dp attention, page size 1, no grammar, no logprobs,
plain DFlash drafters. `check_supported` refuses the rest at startup with what to change.
"""

from __future__ import annotations

import json
import logging
import os
import time

import torch

from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
from sglang.kernels.ops.speculative.dflash import _prepare_dflash_draft_block_unchecked
from sglang.srt.configs.hybrid_arch import hybrid_gdn_config, mambaish_config
from sglang.srt.lora.layers import unwrap_lora_layer
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
    enable_num_token_non_padded,
)
from sglang.srt.runtime_context import get_parallel, get_spec, mamba_track_grid
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
from sglang.srt.speculative.draft_worker_common import build_block_pos_offsets, make_draft_block_spec_info
from sglang.srt.speculative.dflash_worker_v2 import (
    DFlashWorkerV2,
    _resolve_dflash_embedding_module,
)
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_utils import draft_pp_context, draft_tp_context

from ..kernels.tree_step import TreeStep
from . import graph_runner, tree_conv
from .commit import flattened_links
from .memory import GdnShape, describe, describe_tree_step
from .metrics import StepMetrics
from .padding import pad_tree, verify_rows
from .prep import (
    DRAFT_GRAPH_ENV,
    GraphPool,
    TreePrep,
    TreePreps,
    draft_graph_at_block,
    graphs_wanted,
    sglang_mask_buffer,
    step_custom_mask,
    warm_up,
)
from .walk_commit import WalkCommit
from .tree_shape import max_tree_nodes

logger = logging.getLogger(__name__)

# DDTREE_TRACE=PATH: one JSON line per request per decode step (draft top-1 per depth, the tree, the
# target's choices, the accepted path) appended to PATH. A diagnosis aid: it syncs with the host.
TRACE_ENV = "DDTREE_TRACE"


class DDTreeVerifyInput(DFlashVerifyInput):
    """DFLASH's verify input plus the tree links SGLang's hybrid backend reads in TARGET_VERIFY.

    `retrieve_next_token` / `retrieve_next_sibling` are [bs, W] int64 (first child / next
    sibling per row, -1 for none), the EAGLE layout `hybrid_linear_attn_backend` and its
    conv / gated-delta kernels take when `speculative_eagle_topk` > 1.
    """

    def __init__(self, *args, retrieve_next_token=None, retrieve_next_sibling=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.retrieve_next_token = retrieve_next_token
        self.retrieve_next_sibling = retrieve_next_sibling


class DDTreeWorker(DFlashWorkerV2):
    """SGLang's speculative worker for `--speculative-algorithm DDTREE`."""

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        # SGLang reserves max(block, W) KV slots per step (handle_server_args); the drafter keeps
        # its own block: its attention is bidirectional within the block, so a wider block of
        # mask tokens would change its proposals.
        draft_config = parse_dflash_draft_config(draft_hf_config=self.draft_model_runner.model_config.hf_config)
        self.block_size = int(draft_config.resolve_block_size(default=16))
        self.draft_model.set_block_size(self.block_size)
        self._block_pos_offsets = build_block_pos_offsets(length=self.block_size, device=self.device)
        self._draft_block_spec_info = make_draft_block_spec_info(draft_token_num=self.block_size, device=self.device)
        self._draft_block_ids_buf = None  # DFLASH's block buffers are sized on first use
        self.depths = self.block_size - 1
        self.budget = int(server_args.speculative_ddtree_budget)
        self.topk = int(server_args.speculative_ddtree_topk)
        self.spine_depth = int(getattr(server_args, "speculative_ddtree_spine_depth", 0) or 0)
        self.hybrid_mode = getattr(server_args, "speculative_ddtree_hybrid_mode", "safe") or "safe"
        # A tree never has more nodes than L levels of K candidates allow: verify exactly those.
        self.nodes = min(self.budget, max_tree_nodes(self.depths, self.topk))
        self.verify_width = self.nodes + 1
        reserve = int(get_spec().speculative_num_draft_tokens)
        if reserve < max(self.block_size, self.verify_width):
            raise ValueError(
                f"DDTREE needs {max(self.block_size, self.verify_width)} KV slots per step "
                f"(block {self.block_size}, verify width {self.verify_width}) but SGLang reserves {reserve}: "
                "set --speculative-num-draft-tokens to at least that, or leave it unset"
            )
        self._kv_reserve = reserve
        self.speculative_num_draft_tokens = self.verify_width
        self.vocab_size = int(self.model_runner.model_config.vocab_size)
        self._tree_steps: list[TreeStep] = []
        # The tree step's and the walk + commit's graphs, per (batch size, rows): one memory pool for
        # all of them, one draft-logits and one hidden-state buffer for the largest batch so far (prep.py).
        self._graph_pool = GraphPool()
        self._posts: dict[tuple, WalkCommit] = {}
        self._prep_graphs = graphs_wanted(torch.device(self.device), bool(getattr(server_args, "disable_cuda_graph", False)))
        self._preps = TreePreps(self._tree_step, self.depths, self.vocab_size, self.device, graph=self._prep_graphs, pool=self._graph_pool)
        self._trace_path = os.environ.get(TRACE_ENV) or None
        self._metrics = StepMetrics(self.budget, self.nodes, device=self.device)
        # Whether the target has linear-attention (recurrent) layers, and whether they are Gated-DeltaNet's, by
        # SGLang's own tests: its flag for the first, _need_mamba_verify_commit, is set only in
        # init_attention_backends, after this constructor (False all through it).
        self._hybrid = mambaish_config(self.model_runner.model_config) is not None
        self._gdn = hybrid_gdn_config(self.model_runner.model_config) is not None
        self.check_supported()
        # After the check: a setting it refuses (tp > 1 splits the LM head) is said before any compile.
        started = time.perf_counter()
        warm_up(self._tree_step(0), self._lm_head_weight(), self.vocab_size)
        logger.info("DDTREE: the tree step ran once at start (%.1f s: its kernels compile here, not in the first request)",
                    time.perf_counter() - started)
        # The target's verify graphs, when SGLang captures them (after this constructor), carry
        # the tree mask (graph_runner.py); the verify pads its rows to their width (padding.py).
        graph_runner.install(self.target_worker.model_runner)
        # A Gated-DeltaNet target's verify tree conv through the engine's kernel unless DDTREE_SGLANG_TREE_CONV=0
        # (tree_conv.py routes gdn_backend's calls; other hybrids' backends call SGLang's conv through their own names).
        self._tree_conv = tree_conv.install() if self._gdn else None
        self._log_memory()
        logger.info(
            "DDTREE worker: block %d (depths %d), budget %d -> %d tree nodes (verify width %d), topk %d, "
            "spine %d, hybrid target %s (mode %s), tree conv %s",
            self.block_size, self.depths, self.budget, self.nodes, self.verify_width, self.topk,
            self.spine_depth, self._hybrid, self.hybrid_mode,
            {True: "kernels/tree_conv_update", False: "SGLang's", None: "none of the engine's (no Gated-DeltaNet layers)"}[self._tree_conv],
        )

    def check_supported(self) -> None:
        """Refuse, at startup, what this decode step does not implement."""
        problems = []
        if get_parallel().attn_dp_enabled:
            problems.append("dp attention (drop --enable-dp-attention)")
        if get_parallel().tp_size != 1:
            problems.append("tensor parallelism (use --tp-size 1; one replica per GPU)")
        if self.use_compact_draft_cache:
            problems.append("a draft window (drop --speculative-draft-window-size)")
        if self.selector is not None or self.lilicorr is not None or self._is_domino:
            problems.append("selector / LiLiCorr / Domino drafters (use a plain DFlash drafter)")
        if self.page_size != 1:
            problems.append(f"page size {self.page_size} (use --page-size 1)")
        if self.hybrid_mode == "spine" and self._hybrid:
            problems.append(
                "--speculative-ddtree-hybrid-mode spine in SGLang (use safe, exact parent-indexed states; "
                "spine is implemented in the reference backend, ddtree-engine serve)"
            )
        if problems:
            raise ValueError("DDTREE does not support " + "; ".join(problems))

    def _log_memory(self) -> None:
        """Log the tree step's buffers per request and, on a hybrid target, the verify states this
        width holds next to DFLASH's (memory.py)."""
        try:
            weight = self._lm_head_weight()
            logger.info("%s", describe_tree_step(
                self.depths, int(weight.shape[0]), int(weight.shape[1]), self.nodes, self.topk,
                max(self.block_size, self.verify_width), weight.element_size(),
            ))
        except Exception as exc:  # a head this release lays out otherwise: say so, do not stop the server
            logger.info("DDTREE tree-step memory: not determined (%s)", exc)
        if not self._gdn:
            return
        try:
            config = self.model_runner.model_config.hf_text_config.to_dict()
            shape = GdnShape.from_hf_config(config)
            cache = self.model_runner.req_to_token_pool.mamba_pool.mamba_cache
            slots = int(cache.intermediate_ssm.shape[1]) if getattr(cache, "intermediate_ssm", None) is not None else 1
            allocated = sum(
                t.numel() * t.element_size()
                for t in [cache.intermediate_ssm, *getattr(self.model_runner.req_to_token_pool.mamba_pool, "_intermediate_conv_window_phys", [])]
                if t is not None
            )
        except Exception as exc:  # a pool layout this release does not have: say so, do not stop the server
            logger.info("DDTREE verify-state memory: not determined (%s)", exc)
            return
        if shape is not None:
            logger.info("%s; SGLang allocated %.2f GiB of them", describe(shape, self.verify_width, self.block_size, self.topk, slots), allocated / (1 << 30))

    # -- CUDA graphs ------------------------------------------------------------------------

    def init_cuda_graphs(self):
        """Capture the drafter's graphs at its block, whatever width SGLang would give them.

        SGLang sizes every verify-mode graph, the drafter's included, by the resolved
        `speculative_num_draft_tokens`, which for DDTREE is max(block, budget + 1). When the
        budget makes that wider than the block, the drafter's graphs would hold the wrong number of
        rows per request (no block-wide forward could replay them, and capturing its block-sized
        reshapes at that width is not sound); the target still captures (its verify is that wide).

        So the drafter's capture runs under
        `get_spec().override(speculative_num_draft_tokens=block)` (the scheduler captured
        the target's graphs before this, at the full width). SGLang 0.5.23 reads that width for the
        drafter's graph runner when it builds it (`captured_req_width`: its buffers, the capture's
        spec input, `can_run_graph`'s test against the block's spec info) and not at replay; the
        drafter's attention backend takes its per-request rows from the spec info. On the H200
        (2026-12-01) lossless with the eager drafter's verify steps, the drafter replaying on every
        step. A runner captured at another width stops the server; DDTREE_DRAFT_GRAPH_AT_BLOCK=0
        runs the drafter eager instead.
        """
        graph_width = int(get_spec().speculative_num_draft_tokens)
        if graph_width == self.block_size:
            super().init_cuda_graphs()
            return
        if draft_graph_at_block():
            logger.info(
                "DDTREE: capturing the drafter's graphs at its block (%d tokens per request; the target's are %d)",
                self.block_size, graph_width,
            )
            with get_spec().override(speculative_num_draft_tokens=self.block_size):
                super().init_cuda_graphs()
            runner = getattr(self.draft_model_runner, "decode_cuda_graph_runner", None)
            width = getattr(runner, "captured_req_width", None)
            if width is not None and int(width) != self.block_size:
                raise RuntimeError(
                    f"DDTREE: the drafter's graphs were captured {width} tokens per request, not at its block "
                    f"{self.block_size}; set {DRAFT_GRAPH_ENV}=0 to run the drafter eager"
                )
            return
        logger.info(
            "DDTREE: the drafter runs without CUDA graphs: SGLang would capture them %d tokens per "
            "request (budget %d + 1) and the drafter's block is %d (%s=0 switched off capturing them at the block)",
            graph_width, self.budget, self.block_size, DRAFT_GRAPH_ENV,
        )
        with draft_pp_context(), draft_tp_context(self.draft_parallel_layout):
            self._draft_worker.init_cuda_graphs(capture_decode_cuda_graph=False)

    def _maybe_build_draft_sampler(self):
        """None: DDTREE reads the drafter's hidden states and projects every depth itself.

        DFLASH folds a greedy head over the block into the drafter's graph; DDTREE never reads its
        output (`_draft_hidden` takes the hidden states; prep.py applies the LM head), so it would be
        a wasted LM-head matmul in every replay.
        """
        return None

    def _verify_rows(self, bs: int) -> int:
        """Rows per request for this step's verify: the target graph's width when one can replay."""
        runner = self.target_worker.model_runner.decode_cuda_graph_runner
        return verify_rows(
            self.verify_width,
            getattr(runner, "captured_req_width", None),
            bs,
            getattr(runner, "max_bs", None),
            self._kv_reserve,
        )

    # -- the step -------------------------------------------------------------------------

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle():
            return super().forward_batch_generation(
                batch, on_publish=on_publish, grammar_barrier=grammar_barrier, pp_proxy_tensors=pp_proxy_tensors
            )
        if batch.has_grammar:
            raise ValueError("DDTREE does not support grammar-constrained requests")
        if batch.return_logprob:
            raise ValueError("DDTREE does not support logprobs in speculative decoding")
        return self._tree_decode(batch, on_publish)

    def _tree_step(self, i: int) -> TreeStep:
        while len(self._tree_steps) <= i:
            self._tree_steps.append(
                TreeStep(self.depths, self.vocab_size, self.nodes, self.topk, self.device, spine_depth=self.spine_depth)
            )
        return self._tree_steps[i]

    def _lm_head_weight(self) -> torch.Tensor:
        """The target's LM head weight [V', H] (read every step: a weight update may move it)."""
        return unwrap_lora_layer(getattr(self.target_worker.model_runner.model, "lm_head", None)).weight

    def _prep(self, bs: int, rows: int) -> TreePrep:
        """The tree step of a batch of `bs` requests at `rows` verify rows (prep.TreePreps), writing
        the verify mask into SGLang's buffer when there is one for this batch (_sglang_mask_buffer)."""
        return self._preps.get(bs, rows, self._lm_head_weight(), self._sglang_mask_buffer(bs))

    def _sglang_mask_buffer(self, bs: int) -> torch.Tensor | None:
        """The target attention backend's flat verify-mask buffer for `bs` requests, or None
        (prep.sglang_mask_buffer)."""
        return sglang_mask_buffer(getattr(self.target_worker.model_runner.attn_backend, "verify_mask", None), bs)

    def _window_locs(self, batch, prefix_lens: torch.Tensor, width: int) -> torch.Tensor:
        """The KV slots of window positions prefix .. prefix + width - 1 per request, [bs * width]."""
        return assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices,
            req_to_token=self.model_runner.req_to_token_pool.req_to_token,
            start_offset=prefix_lens,
            end_offset=prefix_lens + width,
            batch_size=len(prefix_lens),
            draft_token_num=width,
            device=self.device,
        )

    def _window_plan(self, batch, prefix_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, locs: torch.Tensor, width: int):
        """The target translator's plan of a step writing `locs` and reading `width` rows per request."""
        return self.target_worker.model_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            seq_lens_cpu=seq_lens_cpu,
            write_virtual=locs,
            read_extent=width,
        )

    def _walk_commit(self, steps: list[TreeStep], rows: int, seq_dtype: torch.dtype) -> WalkCommit:
        """The walk and commit of a batch of len(steps) requests at `rows` rows (walk_commit.py)."""
        key = (len(steps), rows, seq_dtype)
        post = self._posts.get(key)
        if post is None:
            req_to_token = self.model_runner.req_to_token_pool.req_to_token
            post = WalkCommit(steps, rows, req_to_token, seq_dtype, graph=self._prep_graphs, pool=self._graph_pool,
                              total=self._metrics.total)
            self._posts[key] = post
        return post

    def _draft_hidden(self, batch, draft_input, bs: int, prefix_lens: torch.Tensor, seq_lens_cpu: torch.Tensor):
        """Run the drafter on the block.

        The block's token ids, positions and KV slots are built as DFLASH builds them: one launch of
        SGLang's `_prepare_dflash_draft_block_unchecked` into DFLASH's persistent buffers (its eager
        fallback where that kernel fails), not six torch ops and a Triton launch. The block's window is
        planned once, as DFLASH plans it: a verify as wide as the block writes the same slots and
        reuses both (`_tree_decode`).

        Returns:
            (hidden [bs, L, H] at depths 1..L, the block's KV slots [bs * block], the window's plan,
            whether the drafter replayed a CUDA graph).
        """
        device, block = self.device, self.block_size
        target_model = self.target_worker.model_runner.model
        embed_module = unwrap_lora_layer(_resolve_dflash_embedding_module(self.draft_model, target_model))
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        self._ensure_draft_block_buffers(bs)
        block_ids = self._draft_block_ids_buf[:bs]
        positions_2d = self._draft_block_positions_buf[:bs]
        locs_2d = self._draft_verify_out_cache_loc_buf[:bs]
        prepared = False
        if self._use_triton_prepare_block:
            try:
                _prepare_dflash_draft_block_unchecked(
                    bonus_tokens=draft_input.bonus_tokens.view(-1),
                    prefix_lens=prefix_lens.view(-1),
                    req_pool_indices=batch.req_pool_indices.view(-1),
                    req_to_token=req_to_token,
                    block_ids_out=block_ids,
                    positions_out=positions_2d,
                    cache_loc_out=locs_2d,
                    mask_token_id=int(self._mask_token_id),
                )
                prepared = True
            except Exception as exc:  # as DFLASH: fall back to the eager block for good
                self._use_triton_prepare_block = False
                logger.warning("DDTREE: SGLang's Triton prepare_block failed; building the block op by op: %s", exc)
        if not prepared:
            block_ids.fill_(int(self._mask_token_id))
            block_ids[:, 0].copy_(draft_input.bonus_tokens.view(-1))
            torch.add(prefix_lens.unsqueeze(1), self._block_pos_offsets, out=positions_2d)
            locs_2d.copy_(self._window_locs(batch, prefix_lens, block).view(bs, block))
        positions = positions_2d.reshape(-1)
        draft_locs = locs_2d.reshape(-1)
        plan = self._window_plan(batch, prefix_lens, seq_lens_cpu, draft_locs, block)
        embeds = embed_module(block_ids)
        if self._noise_embed_scale != 1.0:
            embeds = embeds * self._noise_embed_scale
        draft_seq_lens_cpu = (seq_lens_cpu + block).to(torch.int32)
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=block_ids.flatten(),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            out_cache_loc=draft_locs,
            seq_lens_sum=int(draft_seq_lens_cpu.sum()),
            seq_lens_cpu=draft_seq_lens_cpu,
            positions=positions,
            input_embeds=embeds.view(-1, embeds.shape[-1]),
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=self._draft_block_spec_info,
            capture_hidden_mode=CaptureHiddenMode.NULL,
            num_token_non_padded=(
                torch.full((), bs * block, dtype=torch.int32, device=device) if enable_num_token_non_padded() else None
            ),
            global_num_token_non_padded_cpu=bs * block,
            can_run_decode_cuda_graph=batch.can_run_decode_cuda_graph,
        )
        plan.bind(forward_batch, self.draft_model_runner.kv_index_translator)
        with torch.inference_mode():
            draft_out = self.draft_model_runner.forward(forward_batch)
        hidden = draft_out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE: the DFlash drafter returned no hidden states")
        return hidden.view(bs, block, -1)[:, 1:, :], draft_locs, plan, bool(getattr(draft_out, "can_run_graph", False))

    def _tree_decode(self, batch, on_publish):
        draft_input = batch.spec_info
        bs = len(batch.seq_lens)
        device, width = self.device, self.verify_width
        rows = self._verify_rows(bs)  # == width, or the CUDA-graph width (pad rows after the tree)
        prefix_lens = batch.seq_lens
        if batch.seq_lens_cpu is not None:
            seq_lens_cpu = batch.seq_lens_cpu.to(torch.int64)
        else:
            seq_lens_cpu = prefix_lens.to("cpu", torch.int64)

        # 1-2. Draft hidden states, then per request the LM head, the tree and its padded verify rows
        # on the device (prep.py: one CUDA-graph replay per batch size when graphs are on).
        draft_hidden, draft_locs, draft_plan, draft_graph = self._draft_hidden(batch, draft_input, bs, prefix_lens, seq_lens_cpu)
        roots = draft_input.bonus_tokens.view(-1)
        prep = self._prep(bs, rows)
        prep.run(draft_hidden, roots, prefix_lens)
        steps = prep.steps
        v_tokens = prep.tokens  # [bs, rows]: the W tree rows, then pad rows
        v_first_child, v_next_sibling = prep.first_child, prep.next_sibling
        if self.hybrid_mode == "unsafe":
            # Diagnosis only (behind --speculative-ddtree-allow-hybrid-unsafe): GDN states in flattened order.
            first_child, next_sibling = flattened_links(bs, width, device)
            _, _, v_first_child, v_next_sibling = pad_tree(
                v_tokens[:, :width], prep.depths[:, :width], first_child, next_sibling, rows
            )

        # 3. Verify the tree rows (then any pad rows): positions prefix + depth, KV into the
        # window's first `rows` slots (SGLang reserved max(block, budget + 1) >= rows).
        positions = prep.positions.reshape(-1)
        if rows == self.block_size:
            # The same window as the draft block's (prefix .. prefix + block - 1): its slots and plan, as
            # DFLASH plans its window once for the draft, the verify and the drafter's KV writes.
            verify_locs, plan = draft_locs, draft_plan
        else:
            verify_locs = self._window_locs(batch, prefix_lens, rows)
            plan = self._window_plan(batch, prefix_lens, seq_lens_cpu, verify_locs, rows)
        # SGLang's custom mask: per request [rows, prefix + rows] row-major, True = may attend. The tree
        # step wrote it into SGLang's own buffer when it has one (then SGLang's copy into that buffer
        # before the verify is a copy onto itself, which torch skips); else it is built here.
        custom_mask = step_custom_mask(prep, seq_lens_cpu.tolist())
        # draft_token_num (-> num_tokens_per_req) == the captured width is what lets SGLang's
        # can_run_graph replay; prepare_for_verify loads the graph's buffers when it can.
        verify_input = DDTreeVerifyInput(
            draft_token=v_tokens.reshape(-1),
            positions=positions,
            draft_token_num=rows,
            topk=max(self.topk, 1),
            custom_mask=custom_mask,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            kv_loc_plan=plan,
            retrieve_next_token=v_first_child,
            retrieve_next_sibling=v_next_sibling,
        )
        batch.out_cache_loc = verify_locs
        backup_cpu, backup_sum = batch.seq_lens_cpu, batch.seq_lens_sum
        verify_cpu = seq_lens_cpu + rows
        batch.seq_lens_cpu, batch.seq_lens_sum = verify_cpu, int(verify_cpu.sum())
        verify_batch, _ = verify_input.prepare_for_verify(batch, self.target_worker)
        batch.seq_lens_cpu, batch.seq_lens_sum = backup_cpu, backup_sum
        target_out = self.target_worker.forward_batch_generation(
            batch=None, forward_batch=verify_batch, is_verify=True, skip_attn_backend_init=True
        )
        logits_output = target_out.logits_output
        target_lp = self._target_logits_processor
        if target_lp is not None and target_lp.is_deferred_shard(logits_output.next_token_logits):
            logits_output.next_token_logits = target_lp.finish_deferred_gather(logits_output.next_token_logits)
        # 4-5. Walk each tree with the target's choices (argmax straight into the walk's input; it reads
        # the tree's W rows only: no pad row is ever accepted), then commit: the request's KV window
        # permuted so the accepted nodes come first (walk_commit.py: one CUDA-graph replay per batch
        # size when graphs are on). What leaves this step (the batch's lengths, the next draft input,
        # the scheduler's tokens) is copied out of the replayed buffers, which the graph pool's next
        # replay may overwrite (walk_commit.py).
        post = self._walk_commit(steps, rows, prefix_lens.dtype)
        logits = logits_output.next_token_logits
        torch.argmax(logits.view(bs, rows, logits.shape[-1])[:, :width], dim=-1, out=post.choice)  # bs * rows rows, or raise
        write_ids = plan.write_ids(self.draft_model_runner.kv_index_translator)
        post.run(prefix_lens, batch.req_pool_indices, verify_locs, write_ids)
        commit_lens, bonus, new_seq_lens = post.commit_lens.clone(), post.bonus.clone(), post.new_seq_lens.clone()
        path, order, cols, out_tokens, ctx_locs = post.path, post.order, post.cols, post.out_tokens.clone(), post.ctx_locs
        choice = post.choice

        if self._need_mamba_verify_commit:
            # prefix_lens: the lengths before this verify (the step writes no batch.seq_lens in place).
            self._commit_hybrid_state(batch, prefix_lens, new_seq_lens, commit_lens, path, post.last_row)

        if on_publish is not None:
            on_publish(new_seq_lens)

        # The drafter's context: target hidden states of the committed tokens, in path order.
        hidden = logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE verify needs the target's hidden states, got None")
        hidden = hidden.view(bs, rows, -1)
        hidden = torch.gather(hidden, 1, order.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        self._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=hidden.reshape(-1, hidden.shape[-1]),
            cache_loc=ctx_locs.reshape(-1),
            cache_loc_2d=ctx_locs,
            positions=cols.reshape(-1),
            commit_lens=commit_lens,
        )
        logits_output.hidden_states = None
        line = self._metrics.add(bs, graph=bool(target_out.can_run_cuda_graph), draft_graph=draft_graph)
        if line is not None:
            logger.info("%s", line)
        if self._trace_path:
            draft_logits = prep.logits[..., : self.vocab_size]
            tokens = torch.stack([s.tree[0] for s in steps])
            parents = torch.stack([s.tree[1] for s in steps])
            self._trace(prefix_lens, draft_logits, tokens, parents, choice, path, commit_lens, target_out.can_run_cuda_graph,
                        draft_graph)

        next_draft_input = self._make_next_draft_input_decode(bonus_tokens=bonus, new_seq_lens=new_seq_lens)
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=out_tokens.reshape(-1),
            accept_lens=commit_lens,
            can_run_cuda_graph=target_out.can_run_cuda_graph,
            next_draft_input=next_draft_input,
            speculative_num_draft_tokens=width,
            new_seq_lens=new_seq_lens,
        )

    def _commit_hybrid_state(self, batch, seq_lens_pre, seq_lens_post, commit_lens, path, last_row) -> None:
        """Commit each request's last accepted node's conv window and recurrent state.

        TARGET_VERIFY left one intermediate state per tree row; the one to keep is the row of the
        last accepted node (path[commit_len - 1]), not row commit_len - 1 as in a chain.
        """
        steps_to_track = None
        if batch.mamba_track_indices is not None:
            interval = mamba_track_grid(batch.tree_cache.page_size)
            to_track = seq_lens_pre // interval != seq_lens_post // interval
            point = seq_lens_post // interval * interval
            ith = torch.clamp(point - seq_lens_pre - 1, min=0)
            can = to_track & (ith < commit_lens.to(ith.dtype))
            rows = torch.gather(path, 1, ith.to(torch.int64).clamp(max=path.shape[1] - 1).unsqueeze(1)).squeeze(1)
            steps_to_track = torch.where(can, rows, torch.full_like(rows, -1))
        backend = self.target_worker.model_runner.attn_backend
        backend.update_mamba_state_after_mtp_verify(
            last_correct_step_indices=last_row,
            mamba_track_indices=batch.mamba_track_indices,
            mamba_steps_to_track=steps_to_track,
            model=self.target_worker.model_runner.model,
            req_pool_indices=batch.req_pool_indices[: commit_lens.shape[0]],
        )

    def _trace(self, prefix_lens, draft_logits, tokens, parents, choice, path, commit_lens, graph, draft_graph) -> None:
        """Append this step, one JSON line per request, to DDTREE_TRACE's file."""
        conv = tree_conv.counters()
        with open(self._trace_path, "a") as out:
            for i in range(len(commit_lens)):
                n = int(commit_lens[i])
                record = {
                    "prefix": int(prefix_lens[i]),
                    "draft_top1": draft_logits[i].argmax(dim=-1).tolist(),
                    "tokens": tokens[i].tolist(),
                    "parents": parents[i].tolist(),
                    "choice": choice[i].tolist(),
                    "path": path[i, :n].tolist(),
                    "commit_len": n,
                    "graph": bool(graph),
                    "draft_graph": bool(draft_graph),
                    "tree_conv": conv,  # the routed tree conv's calls so far in this process (tree_conv.counters)
                }
                out.write(json.dumps(record) + "\n")
