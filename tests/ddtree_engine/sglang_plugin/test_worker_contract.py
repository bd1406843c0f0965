"""The DDTREE worker's contract with the installed SGLang, read from SGLang's source.

`ddtree_engine.sglang_plugin.worker` subclasses SGLang's DFLASH worker and reads its internals;
it cannot be imported on this CPU machine (SGLang's model registry imports torchvision, which is
not installed here), so these tests check, in SGLang's own source files, that every name the
worker imports exists, that every `self.<attribute>` it relies on is set by DFlashWorkerV2, and that
the hybrid backend's tree path and commit still take what the worker passes. A release that moves
any of them fails here, before a GPU host does. The worker itself ran on the H200
(benchmarks/sglang_h200/).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import ddtree_engine.sglang_plugin as plugin_pkg

WORKER = Path(plugin_pkg.__file__).with_name("worker.py")
GRAPH_RUNNER = Path(plugin_pkg.__file__).with_name("graph_runner.py")
SGLANG = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])


def module_source(dotted: str) -> tuple[Path, str]:
    rel = dotted.split(".", 1)[1].replace(".", "/")
    for cand in (SGLANG / f"{rel}.py", SGLANG / rel / "__init__.py"):
        if cand.exists():
            return cand, cand.read_text()
    raise AssertionError(f"{dotted} is not in the installed sglang ({SGLANG})")


def top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Try):
            for sub in node.body + [h for x in node.handlers for h in x.body]:
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names |= {(a.asname or a.name).split(".")[0] for a in sub.names}
    return names


def worker_sglang_imports() -> list[tuple[str, str]]:
    """What worker.py and graph_runner.py (the two modules SGLang's scheduler process imports) take from sglang."""
    return [
        (node.module, alias.name)
        for source in (WORKER, GRAPH_RUNNER)
        for node in ast.parse(source.read_text()).body
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sglang")
        for alias in node.names
    ]


def test_the_worker_imports_sglang_names():
    assert len(worker_sglang_imports()) >= 10


@pytest.mark.parametrize("module,name", worker_sglang_imports())
def test_every_name_the_worker_imports_exists(module, name):
    _, text = module_source(module)
    assert name in top_level_names(ast.parse(text)), f"{module} no longer defines {name}"


def inherited_attributes() -> set[str]:
    """`self.<name>` the worker reads but does not set itself (so DFlashWorkerV2 must)."""
    text = WORKER.read_text()
    used = set(re.findall(r"self\.(_?[A-Za-z][A-Za-z0-9_]*)", text))
    own = set(re.findall(r"self\.(_?[A-Za-z][A-Za-z0-9_]*)\s*(?::[^=\n]+)?=[^=]", text))
    own |= set(re.findall(r"def (_?[A-Za-z][A-Za-z0-9_]*)\(self", text))
    return used - own


def test_the_worker_relies_on_dflash_attributes():
    assert {"_mask_token_id", "_need_mamba_verify_commit", "draft_model_runner", "target_worker"} <= inherited_attributes()


@pytest.mark.parametrize("attr", sorted(inherited_attributes()))
def test_every_inherited_attribute_is_set_by_the_dflash_worker(attr):
    text = "".join(module_source(m)[1] for m in ("sglang.srt.speculative.dflash_worker_v2", "sglang.srt.speculative.base_spec_worker"))
    assert re.search(rf"self\.{attr}\s*(:[^=\n]+)?=[^=]|def {attr}\(\s*self", text), f"DFlashWorkerV2 no longer sets self.{attr}"


def test_the_decode_step_overrides_dflash_with_the_same_signature():
    _, text = module_source("sglang.srt.speculative.dflash_worker_v2")
    assert re.search(r"def forward_batch_generation\(\s*self,\s*batch: ScheduleBatch,\s*on_publish=None,\s*grammar_barrier=None,\s*pp_proxy_tensors=None,", text)
    assert "def _append_target_hidden_to_draft_kv_by_loc(" in text and "cache_loc_2d: Optional[torch.Tensor] = None" in text


def test_the_verify_input_takes_the_fields_the_worker_passes():
    _, text = module_source("sglang.srt.speculative.dflash_info")
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "DFlashVerifyInput")
    fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}
    assert {"draft_token", "positions", "draft_token_num", "topk", "custom_mask", "capture_hidden_mode", "kv_loc_plan"} <= fields


def test_the_hybrid_backend_walks_the_tree_links_in_target_verify():
    _, text = module_source("sglang.srt.layers.attention.hybrid_linear_attn_backend")
    block = text[text.index("elif forward_batch.forward_mode.is_target_verify():") :][:2000]
    assert "if self.topk > 1:" in block
    assert "forward_batch.spec_info.retrieve_next_token" in block and "forward_batch.spec_info.retrieve_next_sibling" in block
    assert "self.topk = get_spec().speculative_eagle_topk" in text


def test_the_hybrid_commit_takes_the_row_to_keep():
    _, text = module_source("sglang.srt.layers.attention.hybrid_linear_attn_backend")
    sig = text[text.index("def update_mamba_state_after_mtp_verify(") :][:400]
    for param in ("last_correct_step_indices", "mamba_track_indices", "mamba_steps_to_track", "model", "req_pool_indices"):
        assert param in sig


def test_the_result_fields_the_worker_fills_exist():
    _, text = module_source("sglang.srt.managers.utils")
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "GenerationBatchResult")
    fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}
    worker = WORKER.read_text()
    passed = set(re.findall(r"\n\s+(\w+)=", worker[worker.index("return GenerationBatchResult(") :].split(")\n")[0]))
    assert passed and passed <= fields, passed - fields


def test_engine_rebinding_targets_the_engine_class_attribute():
    """register() rebinds Engine.server_args_class (a class attribute the REPLACE hook misses)."""
    _, text = module_source("sglang.srt.entrypoints.engine")
    assert "server_args_class: ServerArgs = ServerArgs" in text
    assert "server_args = self.server_args_class(**kwargs)" in text
    assert "load_plugins()" in text[text.index("def __init__(self, **kwargs):") :][:600]
    assert "sglang.srt.entrypoints.engine" in inspect.getsource(plugin_pkg.rebind_engine_server_args)


def test_the_verify_state_layout_memory_py_sizes_is_sglangs():
    """memory.py's arithmetic is SGLang's MambaPool: per-row fp32-or-model-dtype states [layers, slots + 1,
    rows, ...], a deduplicated conv window only for a chain (topk <= 1), and the attributes the worker's
    startup log reads (`mamba_cache.intermediate_ssm`, `_intermediate_conv_window_phys`)."""
    _, pool = module_source("sglang.srt.mem_cache.memory_pool")
    assert "speculative_num_draft_tokens,\n                            temporal_state_shape[0]," in pool
    assert "spec_state_size + 1," in pool
    assert "self._intermediate_conv_window_phys" in pool and "intermediate_ssm=intermediate_ssm_state_cache" in pool
    assert "conv_window_dedup_enabled(\n                        _is_npu, _is_cpu, speculative_eagle_topk" in pool
    tree = ast.parse(pool)
    enabled = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "conv_window_dedup_enabled")
    assert "topk" in ast.unparse(enabled)


# -- CUDA graphs (graph_runner.py, padding.py, the worker's draft-graph choice) -----------------


def class_methods(text: str, name: str) -> dict[str, list[str]]:
    cls = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef) and n.name == name)
    return {f.name: [a.arg for a in f.args.args] for f in cls.body if isinstance(f, ast.FunctionDef)}


def function_source(text: str, name: str) -> str:
    node = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(text, node)


def test_the_graph_runner_overrides_only_what_sglangs_runner_defines_and_capture_calls():
    _, runner = module_source("sglang.srt.model_executor.runner.decode_cuda_graph_runner")
    ours = class_methods(GRAPH_RUNNER.read_text(), "DDTreeDecodeCudaGraphRunner")
    theirs = class_methods(runner, "DecodeCudaGraphRunner")
    assert ours == {"get_spec_info": ["self", "num_tokens"]}
    for method, args in ours.items():
        assert theirs.get(method) == args, f"DecodeCudaGraphRunner.{method}{tuple(args)} is gone or changed"
    # Capture builds its verify input there (the one call), and the DFLASH branch leaves the
    # mask off on the backends that can verify a chain causally, Triton among them.
    assert runner.count("self.get_spec_info(num_tokens)") == 1
    dflash_branch = function_source(runner, "get_spec_info").split("is_dflash_family()")[1]
    assert "if (self.model_runner.is_draft_worker or not build_custom_mask)" in " ".join(dflash_branch.split())
    assert "self.buffers.custom_mask" in dflash_branch
    _, utils = module_source("sglang.srt.speculative.dflash_utils")
    skip = utils[utils.index("_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS = frozenset(") :].split(")")[0]
    assert '"TritonAttnBackend"' in skip


def test_the_graph_runner_puts_the_runners_mask_buffer_on_the_targets_capture_input():
    body = " ".join(function_source(GRAPH_RUNNER.read_text(), "get_spec_info").split())
    assert "spec_info = super().get_spec_info(num_tokens)" in body
    assert "not self.model_runner.is_draft_worker" in body
    assert "spec_info.custom_mask = self.buffers.custom_mask" in body


def test_the_runner_class_override_point_is_the_one_capture_uses():
    """graph_runner.install sets `_decode_cuda_graph_runner_cls` on the target's model runner:
    SGLang's documented override point, the default factory capture_decode_graph builds from on
    CUDA (no platform class), called after the speculative worker exists."""
    _, model_runner = module_source("sglang.srt.model_executor.model_runner")
    assert "def _decode_cuda_graph_runner_cls(self):" in model_runner
    assert "return DecodeCudaGraphRunner" in function_source(model_runner, "_decode_cuda_graph_runner_cls")
    _, setup = module_source("sglang.srt.model_executor.model_runner_components.cuda_graph_setup")
    capture = " ".join(function_source(setup, "capture_decode_graph").split())
    assert "GraphRunnerCls = current_platform.get_graph_runner_cls() if GraphRunnerCls is None:" in capture
    assert "graph_runners = defaultdict( model_runner._decode_cuda_graph_runner_cls," in capture
    assert "runner = GraphRunnerCls(model_runner)" in capture
    platforms = [p for p in (SGLANG / "srt" / "platforms").rglob("*.py") if "def get_graph_runner_cls" in p.read_text()]
    assert [p.name for p in platforms] == ["interface.py"]  # only the default: None
    install = GRAPH_RUNNER.read_text()
    assert "model_runner._decode_cuda_graph_runner_cls = lambda: DDTreeDecodeCudaGraphRunner" in install
    assert "current = model_runner._decode_cuda_graph_runner_cls()" in install
    _, scheduler = module_source("sglang.srt.managers.scheduler")
    init = function_source(scheduler, "init_model_worker")
    assert init.index("self.maybe_init_draft_worker()") < init.index("self.init_all_cuda_graphs()")
    assert "graph_runner.install(self.target_worker.model_runner)" in WORKER.read_text()


def test_triton_captures_and_replays_the_mask_only_when_the_capture_input_had_one():
    _, triton = module_source("sglang.srt.layers.attention.triton_backend")
    flat = " ".join(triton.split())
    assert (
        "custom_mask = ( self._verify_mask.buffer if self._verify_mask is not None and spec_info is not None "
        "and spec_info.custom_mask is not None else None )"
    ) in flat
    replay = " ".join(function_source(triton, "_update_target_verify_buffers").split())
    assert "custom_mask[: spec_info.custom_mask.shape[0]] = spec_info.custom_mask" in replay
    # The layout padding.tree_custom_mask builds: [C, prefix + C] per request, C the row count.
    assert "seq_mask_len = num_tokens_per_req * (seq_lens + num_tokens_per_req)" in replay
    assert "num_tokens_per_req = self._target_verify_num_tokens_per_req(spec_info)" in replay


def test_the_mask_buffer_the_tree_step_writes_is_sglangs_verify_mask():
    """worker._sglang_mask_buffer reads the target backend's `verify_mask` (a hybrid backend's is its
    full-attention child's): a VerifyMask with buffer, mode, is_read and fits(bs), the triton backend's
    a flat uint8 FULL_MASK buffer allocated with its graphs; the replay's copy into it from
    spec_info.custom_mask (a view of the same cells then) is what torch skips."""
    _, mask = module_source("sglang.srt.layers.attention.verify_mask")
    vm = ast.parse(mask)
    fields = {n.target.id for c in vm.body if isinstance(c, ast.ClassDef) and c.name == "VerifyMask"
              for n in c.body if isinstance(n, ast.AnnAssign)}
    assert {"buffer", "mode", "max_bs", "is_read"} <= fields
    assert "def fits(self, bs: int) -> bool:" in mask
    assert "elif mode == TreeMaskMode.FULL_MASK:\n        per_req = num_draft_tokens * (max_context_len + num_draft_tokens)" in mask
    _, base = module_source("sglang.srt.layers.attention.base_attn_backend")
    assert "def verify_mask(self) -> Optional[VerifyMask]:" in base
    _, hybrid = module_source("sglang.srt.layers.attention.hybrid_linear_attn_backend")
    assert "return self.full_attn_backend.verify_mask" in " ".join(function_source(hybrid, "verify_mask").split())
    _, triton = module_source("sglang.srt.layers.attention.triton_backend")
    flat = " ".join(triton.split())
    assert "is_read=True, dtype=torch.uint8, )" in flat and "return self._verify_mask" in flat
    assert "def verify_mask(self) -> Optional[VerifyMask]:" in triton
    worker = WORKER.read_text()
    assert 'getattr(self.target_worker.model_runner.attn_backend, "verify_mask", None)' in worker
    assert "custom_mask = step_custom_mask(prep, seq_lens_cpu.tolist())" in worker
    assert "return self._preps.get(bs, rows, self._lm_head_weight(), self._sglang_mask_buffer(bs))" in worker


def test_the_mask_modes_sglang_mask_buffer_names_are_sglangs():
    """prep.sglang_mask_buffer takes a buffer whose VerifyMask mode is named FULL_MASK, made on the GPU by
    default_tree_mask_mode (QLEN_ONLY on a CPU). (VerifyMask itself is not imported here: its module
    imports torchvision through eagle_utils; the selection is tested on a stand-in in test_prep.py.)"""
    _, spec_tree = module_source("sglang.kernels.ops.speculative.spec_tree")
    mode = next(n for n in ast.parse(spec_tree).body if isinstance(n, ast.ClassDef) and n.name == "TreeMaskMode")
    members = {t.id for n in mode.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert {"FULL_MASK", "QLEN_ONLY"} <= members
    _, eagle = module_source("sglang.srt.speculative.eagle_utils")
    assert "return TreeMaskMode.QLEN_ONLY if _is_cpu else TreeMaskMode.FULL_MASK" in eagle


def test_a_verify_replays_only_at_the_captured_width_and_prepare_for_verify_loads_it():
    _, runner = module_source("sglang.srt.model_executor.runner.decode_cuda_graph_runner")
    can_run = " ".join(function_source(runner, "can_run_graph").split())
    assert "and spec_info.num_tokens_per_req != self.captured_req_width ): return False" in can_run
    assert "get_spec().speculative_num_draft_tokens if speculative_num_draft_tokens is None" in " ".join(runner.split())
    assert "self.captured_req_width = model_runner.decode_num_tokens_per_req(" in runner
    assert "self.max_bs = max(self.capture_bs)" in runner
    _, info = module_source("sglang.srt.speculative.dflash_info")
    assert "if self.num_tokens_per_req == -1:\n            self.num_tokens_per_req = int(self.draft_token_num)" in info
    prepare = " ".join(function_source(info, "prepare_for_verify").split())
    assert "decode_cuda_graph_runner.can_run_graph( verify_forward_batch )" in prepare
    assert "decode_cuda_graph_runner.load_batch( verify_forward_batch )" in prepare
    _, spec_info = module_source("sglang.srt.speculative.spec_info")
    assert "return num_draft_tokens" in function_source(spec_info, "get_num_tokens_per_req_for_target_verify")
    # TARGET_VERIFY is a graph mode for the decode runner; the prefill (piecewise) runner refuses it.
    _, batch_info = module_source("sglang.srt.model_executor.forward_batch_info")
    assert "or self == ForwardMode.TARGET_VERIFY" in function_source(batch_info, "is_cuda_graph")
    _, prefill = module_source("sglang.srt.model_executor.runner.prefill_cuda_graph_runner")
    assert "if is_target_verify:\n            return False" in prefill


def test_the_hybrid_backend_copies_the_links_into_its_graph_buffers_duck_typed():
    _, hybrid = module_source("sglang.srt.layers.attention.hybrid_linear_attn_backend")
    flat = " ".join(hybrid.split())
    assert 'and getattr(spec_info, "retrieve_next_token", None) is not None' in flat
    assert "self.retrieve_next_token_list[bs - 1][:bs_without_pad].copy_( spec_info.retrieve_next_token )" in flat
    assert "(i + 1, draft_token_num), dtype=torch.int32" in flat  # int64 links cast by copy_
    assert "draft_token_num = max_num_tokens // max_bs" in flat  # the captured width
    # The isinstance(EagleVerifyInput) plan-stream fixup: only EAGLE's worker calls it.
    callers = [
        str(p.relative_to(SGLANG))
        for p in (SGLANG / "srt" / "speculative").rglob("*.py")
        if "update_verify_buffers_to_fill_after_draft(" in p.read_text()
    ]
    assert callers == ["srt/speculative/eagle_worker_common.py"]
    # A pad row no link reaches gets the root as parent (padding.py relies on it).
    _, conv = module_source("sglang.kernels.ops.mamba.causal_conv1d_triton")
    assert "parent_idx_tokens = tl.zeros((NP2_SEQLEN,), dtype=tl.int32)" in conv


def test_the_drafter_graph_choice_rides_dflash_init_cuda_graphs():
    _, dflash = module_source("sglang.srt.speculative.dflash_worker_v2")
    theirs = class_methods(dflash, "DFlashWorkerV2")
    worker = WORKER.read_text()
    ours = class_methods(worker, "DDTreeWorker")
    for method in ("init_cuda_graphs", "_maybe_build_draft_sampler"):
        assert theirs[method] == ours[method] == ["self"], method
    init = " ".join(function_source(dflash, "init_cuda_graphs").split())
    assert "self._draft_sampler = self._maybe_build_draft_sampler()" in init
    assert "self._draft_worker.init_cuda_graphs( capture_decode_cuda_graph=capture_decode_cuda_graph )" in init
    assert "with ( draft_pp_context(), draft_tp_context(self.draft_parallel_layout), ):" in init
    _, tp_worker = module_source("sglang.srt.managers.tp_worker")
    assert "def init_cuda_graphs(self, capture_decode_cuda_graph: bool = True):" in tp_worker
    ours_init = " ".join(function_source(worker, "init_cuda_graphs").split())
    assert "self._draft_worker.init_cuda_graphs(capture_decode_cuda_graph=False)" in ours_init
    assert "graph_width = int(get_spec().speculative_num_draft_tokens)" in ours_init


def test_the_drafter_graph_at_its_block_rests_on_what_sglang_reads_when():
    """The drafter's graphs at its block (DDTREE_DRAFT_GRAPH_AT_BLOCK, on by default) are captured under get_spec().override(speculative_num_draft_tokens=
    block): sound only while SGLang reads that width for a runner when it builds it, keeps it on the runner
    for the capture and the replay test, and reports whether a forward replayed."""
    ours_init = " ".join(function_source(WORKER.read_text(), "init_cuda_graphs").split())
    assert "with get_spec().override(speculative_num_draft_tokens=self.block_size): super().init_cuda_graphs()" in ours_init
    assert 'getattr(self.draft_model_runner, "decode_cuda_graph_runner", None)' in ours_init
    _, context = module_source("sglang.srt.runtime_context")
    assert "def override(self, **kwargs):" in context and "@contextmanager" in context
    _, runner = module_source("sglang.srt.model_executor.runner.decode_cuda_graph_runner")
    flat = " ".join(runner.split())
    # Built: the width from the spec context (no explicit width), kept on the runner.
    assert ("self.speculative_num_draft_tokens = ( get_spec().speculative_num_draft_tokens "
            "if speculative_num_draft_tokens is None else speculative_num_draft_tokens )") in flat
    assert "self.captured_req_width = model_runner.decode_num_tokens_per_req( num_draft_tokens=self.speculative_num_draft_tokens )" in flat
    # Captured with the runner's width; replayed only for a batch of that width per request.
    assert "draft_token_num=self.speculative_num_draft_tokens," in runner
    assert "and spec_info.num_tokens_per_req != self.captured_req_width" in flat
    # The block's spec info says block tokens per request; the forward says whether it replayed.
    _, common = module_source("sglang.srt.speculative.draft_worker_common")
    assert "def make_draft_block_spec_info(" in common
    _, model_runner = module_source("sglang.srt.model_executor.model_runner")
    assert "class ModelRunnerOutput:" in model_runner and "can_run_graph: bool" in model_runner
def test_the_pool_sizing_the_shortfall_wrapper_wraps_raises_what_it_matches():
    """fit.install wraps KVCacheConfigurator._handle_max_mamba_cache and matches SGLang's shortfall
    message; a release that renames either would leave DDTREE's message silently unused."""
    from ddtree_engine.sglang_plugin import fit

    module, cls_name, method = fit.TARGET
    path, source = module_source(module)
    tree = ast.parse(source)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
    assert cls is not None, f"{cls_name} is not in {path}"
    fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method), None)
    assert fn is not None, f"{cls_name}.{method} is not in {path}"
    assert fit.SHORTFALL in ast.get_source_segment(source, fn), f"{method} no longer raises {fit.SHORTFALL!r}"
    # Its one caller passes the rest (GB) positionally and blames the weights when the result is <= 0:
    # the wrapper's second case (fit.LEFT_NOTHING) reads that argument and that result.
    caller = " ".join(source[source.index("def _profile_available_bytes"):].split())
    assert f"rest_memory = self.{method}(rest_memory)" in caller
    after = caller[caller.index(f"self.{method}(rest_memory)"):]
    assert "if rest_memory <= 0:" in after and fit.LEFT_NOTHING in after[:1500]
    assert "return int(rest_memory * (1 << 30))" in after  # GB in and out: the wrapper compares GB
    # fit.verify_states_gb prices the verify states as the radix-cache-off path reserves them.
    body = " ".join(ast.get_source_segment(source, fn).split())
    assert ("intermediate_size = ( stage_per_req * (get_schedule().max_mamba_cache_size + 1) "
            "* get_spec().speculative_num_draft_tokens )") in body
    assert "get_exec().mamba.enable_linear_replayssm_spec" in body and "mamba2_cache_params.mamba_cache_per_req" in body
    # What ddtree_message reads from SGLang's runtime context.
    _, context = module_source("sglang.srt.runtime_context")
    assert {"get_spec", "get_schedule"} <= top_level_names(ast.parse(context))
    # And the scheduler asks for the draft worker (DDTreeSpecAlgo.create_worker installs the wrapper)
    # before it sizes the pools.
    _, scheduler = module_source("sglang.srt.managers.scheduler")
    body = scheduler[scheduler.index("def init_model_worker(self):"):]
    assert body.index("self.maybe_init_draft_worker()") < body.index("self.init_memory_pools()")


def test_the_tree_verify_kernel_grows_with_the_steps_rows_as_step_max_rows_reads_it():
    """spec.STEP_MAX_ROWS rests on this: the hybrid backend's tree verify (Triton, whatever the linear-attention
    backends) runs fused_sigmoid_gating_delta_rule_update with the parent indices, whose width constexpr NP2_T is
    next_power_of_2 of the whole step's rows (T of the packed [1, rows, ...] input under cu_seqlens), loaded as one
    vector per program and reduced over once per token. A release that sizes it per request instead makes the cap
    unnecessary: this fails so the cap is reconsidered."""
    _, backend = module_source("sglang.srt.layers.attention.linear.gdn_backend")
    assert re.search(r"triton_kernel = TritonGDNKernel\(\)\s+self\.tree_verify_kernel = triton_kernel", backend)
    assert "self.tree_verify_kernel\n            if retrieve_parent_token is not None" in backend
    _, triton_kernel = module_source("sglang.srt.layers.attention.linear.kernels.gdn_triton")
    verify = triton_kernel[triton_kernel.index("    def target_verify(") :][:1600]
    assert "return fused_sigmoid_gating_delta_rule_update(" in verify and "retrieve_parent_token=retrieve_parent_token" in verify
    _, kernel = module_source("sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent")
    assert "B, T, H, K, V = *k.shape, v.shape[-1]" in kernel
    assert "NP2_T = triton.next_power_of_2(T)" in kernel and "NP2_T=NP2_T," in kernel
    assert "    NP2_T: tl.constexpr," in kernel
    body = kernel[kernel.index("if HAS_EAGLE_TREE_CUSTOM_ATTN_MASK:\n        token_indices = tl.arange(0, NP2_T)") :][:2000]
    assert "for _ in range(0, T):" in body
    assert "tl.sum(\n                    tl.where(token_indices == step_idx, parent_idx_tokens, 0)" in body


def method_node(text: str, cls_name: str, name: str) -> ast.FunctionDef:
    cls = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef) and n.name == cls_name)
    return next(f for f in cls.body if getattr(f, "name", None) == name)


def method_source(text: str, cls_name: str, name: str) -> str:
    return " ".join(ast.get_source_segment(text, method_node(text, cls_name, name)).split())


def test_what_the_constructor_asks_of_the_target_it_asks_by_sglangs_own_tests():
    """SGLang's hybrid flag, _need_mamba_verify_commit, is False through the constructor (set in
    init_attention_backends, after it), so the constructor and what it calls (check_supported: spine refused on a
    hybrid target; _log_memory: the GDN states; tree_conv.install: the GDN backend's conv) never read it: they ask
    mambaish_config (what the flag's first half asks) and hybrid_gdn_config (the GDN layers gdn_backend serves)."""
    _, dflash = module_source("sglang.srt.speculative.dflash_worker_v2")
    assert "self._need_mamba_verify_commit = False" in method_source(dflash, "DFlashWorkerV2", "__init__")
    backends = method_source(dflash, "DFlashWorkerV2", "init_attention_backends")
    assert "self._need_mamba_verify_commit = mambaish_config( self.model_runner.model_config ) is not None" in backends
    _, arch = module_source("sglang.srt.configs.hybrid_arch")
    assert "or hybrid_gdn_config(model_config)" in " ".join(function_source(arch, "mambaish_config").split())
    text = WORKER.read_text()
    ours = method_source(text, "DDTreeWorker", "__init__")
    assert "self._hybrid = mambaish_config(self.model_runner.model_config) is not None" in ours
    assert "self._gdn = hybrid_gdn_config(self.model_runner.model_config) is not None" in ours
    assert ours.index("self._gdn = ") < ours.index("self.check_supported()")
    assert "self._tree_conv = tree_conv.install() if self._gdn else None" in ours
    assert 'if self.hybrid_mode == "spine" and self._hybrid:' in method_source(text, "DDTreeWorker", "check_supported")
    assert "if not self._gdn: return" in method_source(text, "DDTreeWorker", "_log_memory")
    for name in ("__init__", "check_supported", "_log_memory"):
        read = {n.attr for n in ast.walk(method_node(text, "DDTreeWorker", name)) if isinstance(n, ast.Attribute)}
        assert "_need_mamba_verify_commit" not in read, name  # always False while these run
