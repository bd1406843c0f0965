"""DDTreeSpecAlgo against the installed SGLang: its conformance check, every method SGLang calls on
an algorithm, DFLASH's answers where DDTREE rides DFLASH, and every target the plugin names."""

from __future__ import annotations

import pkgutil
import re
from pathlib import Path

import pytest

# Called on `spec_algorithm` / `spec_algo` / `speculative_algorithm` objects anywhere in SGLang's
# runtime; the four the default CustomSpecAlgo lacks must be among them (the grep works).
CALL = re.compile(r"\b(?:spec_algorithm|spec_algo|speculative_algorithm)\.([A-Za-z_]\w*)\(")
# ... and on `SpeculativeAlgorithm.from_string(...)` directly (arguments may span lines).
CALL_ON_FROM_STRING = re.compile(r"SpeculativeAlgorithm\.from_string\((?:[^()]|\([^()]*\))*\)\s*\.([A-Za-z_]\w*)\(")
DEFAULT_CUSTOM_LACKS = {"carries_draft_hidden_states", "create_future_map", "need_topk", "get_platform_worker_cls"}
# Where DDTREE answers differently from DFLASH on purpose (spec.py says why).
NOT_DFLASH = {"supports_mixed_chunk", "supports_grammar_overlap"}


@pytest.fixture(scope="module")
def ddtree(sglang_plugin):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return SpeculativeAlgorithm.from_string("DDTREE")


def _called_methods(paths) -> set[str]:
    names = set()
    for path in paths:
        text = Path(path).read_text()
        names |= set(CALL.findall(text)) | set(CALL_ON_FROM_STRING.findall(text))
    # `speculative_algorithm` is also the config string (`.upper()`): not algorithm methods.
    return {name for name in names if not hasattr(str, name)}


def test_ddtree_is_the_registered_class_and_conforms(ddtree):
    from ddtree_engine.sglang_plugin.spec import DDTreeSpecAlgo
    from sglang.srt.speculative.spec_registry import _assert_custom_spec_algo_conforms

    assert type(ddtree) is DDTreeSpecAlgo and ddtree.name == "DDTREE"
    _assert_custom_spec_algo_conforms(DDTreeSpecAlgo)
    assert ddtree.supports_overlap is False
    assert ddtree.validate_server_args.__name__ == "check_ddtree_settings"


def test_every_method_the_scheduler_calls_exists(ddtree):
    import sglang

    root = Path(sglang.__file__).parent / "srt" / "managers"
    scheduler_files = sorted(root.glob("scheduler*.py")) + sorted((root / "scheduler_components").glob("*.py"))
    called = _called_methods(scheduler_files)
    assert {"create_worker", "create_future_map", "carries_draft_hidden_states", "is_dflash_family"} <= called
    missing = sorted(name for name in called if not callable(getattr(ddtree, name, None)))
    assert missing == [], f"DDTreeSpecAlgo lacks {missing}, which SGLang's scheduler calls"


def test_every_method_sglang_calls_on_an_algorithm_exists(ddtree):
    import sglang

    # sglang.srt is a namespace package (no __file__): walk it from sglang's own folder.
    called = _called_methods((Path(sglang.__file__).parent / "srt").rglob("*.py"))
    assert DEFAULT_CUSTOM_LACKS <= called
    missing = sorted(name for name in called if not callable(getattr(ddtree, name, None)))
    assert missing == [], f"DDTreeSpecAlgo lacks {missing}, which SGLang calls on a speculative algorithm"


def test_ddtree_answers_as_dflash_except_where_it_says_why(ddtree):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    dflash = SpeculativeAlgorithm.DFLASH
    predicates = sorted(
        name for name in vars(SpeculativeAlgorithm)
        if name.startswith(("is_", "supports_")) or name in {"has_draft_kv", "carries_draft_hidden_states", "need_topk"}
    )
    assert {"is_dflash", "is_dflash_family", "supports_target_verify_for_draft", "need_topk"} <= set(predicates)
    answers = {name: (getattr(dflash, name)(), getattr(ddtree, name)()) for name in predicates}
    differ = {name: pair for name, pair in answers.items() if pair[0] != pair[1]}
    assert set(differ) == NOT_DFLASH and all(ours is False for _, ours in differ.values())
    assert ddtree.get_platform_worker_cls() is None  # the in-tree CUDA platform keeps SGLang's own
    assert ddtree.get_num_tokens_per_req_for_target_verify(16, is_draft_worker=True) == 16


def test_create_worker_refuses_overlap_scheduling_with_the_flag_to_add(ddtree, parse):
    record = parse(["--model-path", "/nonexistent/target", "--speculative-algorithm", "DDTREE"])
    with pytest.raises(ValueError, match=r"^DDTREE does not support overlap scheduling: add --disable-overlap-schedule\.$"):
        ddtree.create_worker(record)


def test_every_target_the_plugin_names_exists_in_the_installed_sglang(sglang_plugin):
    import sglang.srt.server_args as server_args_module
    from ddtree_engine.sglang_plugin.flags import DDTreeServerArgs
    from sglang.srt.plugins.hook_registry import HookRegistry

    for target, hook_type, _why in sglang_plugin.PATCHED_TARGETS:
        assert target in HookRegistry._patched, f"{target}: registered but not applied"
        assert hook_type in {"BEFORE", "AFTER", "AROUND", "REPLACE"}
    # The one class REPLACE: SGLang's launcher now builds DDTreeServerArgs, a subclass of its own.
    assert server_args_module.ServerArgs is DDTreeServerArgs
    original = DDTreeServerArgs.__mro__[1]
    assert (original.__module__, original.__name__) == ("sglang.srt.server_args", "ServerArgs")
    for target in sglang_plugin.USED_TARGETS:
        assert pkgutil.resolve_name(target) is not None, target
