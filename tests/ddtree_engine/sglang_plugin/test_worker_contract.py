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
    tree = ast.parse(WORKER.read_text())
    return [
        (node.module, alias.name)
        for node in tree.body
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
    # What ddtree_message reads from SGLang's runtime context.
    _, context = module_source("sglang.srt.runtime_context")
    assert {"get_spec", "get_schedule"} <= top_level_names(ast.parse(context))
    # And the scheduler asks for the draft worker (DDTreeSpecAlgo.create_worker installs the wrapper)
    # before it sizes the pools.
    _, scheduler = module_source("sglang.srt.managers.scheduler")
    body = scheduler[scheduler.index("def init_model_worker(self):"):]
    assert body.index("self.maybe_init_draft_worker()") < body.index("self.init_memory_pools()")
