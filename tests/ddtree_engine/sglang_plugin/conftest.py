"""Contract tests of the SGLang plugin against the real, pinned sglang wheel, imported on the CPU.

They run in `.venv-sglang` (`make test` builds it: sglang --no-deps next to the CPU torch, see the
Makefile). In a venv without sglang they are not collected, unless DDTREE_REQUIRE_SGLANG is set
(as `make test` sets it), where a missing sglang is an error rather than a silent skip.

Resolving a whole ServerArgs on this machine is not possible: `resolve_once()` reaches
`sglang.srt.configs`, which imports torchvision (not installed: it pins its own torch). The tests
therefore run SGLang's speculative resolution step itself, `handle_speculative_decoding`, on a
record parsed by `ServerArgs.add_cli_args` + `ServerArgs.from_cli_args`, after the bookkeeping
`run_resolution_pipeline` sets up first, with `--device cuda` (a string here: nothing probes a
device at this step). Where a draft model path is set, that step's alias check loads the draft's
HF config, which imports torchvision too; those tests make SGLang's own call for a registered
algorithm instead (`record_foreign_defaults(record, source, algo.handle_server_args)`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os

import pytest

if importlib.util.find_spec("sglang") is None:
    if os.environ.get("DDTREE_REQUIRE_SGLANG"):
        raise RuntimeError(
            "DDTREE_REQUIRE_SGLANG is set but sglang is not importable: run these tests with "
            ".venv-sglang/bin/pytest (make venv-sglang builds it)"
        )
    collect_ignore_glob = ["test_*.py"]

@pytest.fixture(scope="session")
def sglang_plugin():
    """SGLang with its plugins loaded the way every SGLang process loads them."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    import ddtree_engine.sglang_plugin as plugin

    return plugin


@pytest.fixture(scope="session")
def parse(sglang_plugin):
    """Parse argv with SGLang's own ServerArgs (as patched), into a record ready to resolve."""
    import sglang.srt.server_args as server_args_module
    from sglang.srt.arg_groups.arg_utils import record_fields

    def _parse(argv: list[str]):
        server_args_cls = server_args_module.ServerArgs
        parser = argparse.ArgumentParser()
        server_args_cls.add_cli_args(parser)
        record = server_args_cls.from_cli_args(parser.parse_args(argv))
        # What run_resolution_pipeline sets up before its first step; _input_frozen makes any
        # write to the record (instead of a declaration) raise, as in a real resolution.
        record._raw_input = {f.name: getattr(record, f.name) for f in record_fields(type(record))}
        record._resolved_overrides = []
        record._input_frozen = True
        return record

    return _parse


@pytest.fixture(scope="session")
def resolve_step(parse):
    """Run SGLang's speculative resolution step on argv; return the record."""
    from sglang.srt.arg_groups.resolution_hooks import run_hook
    from sglang.srt.arg_groups.speculative_hook import handle_speculative_decoding

    def _resolve(argv: list[str]):
        record = parse(argv)
        run_hook(handle_speculative_decoding, record)
        return record

    return _resolve


@pytest.fixture(scope="session")
def resolve_registered(parse):
    """SGLang's two calls for a registered algorithm (validate, then handle); return the record."""
    from sglang.srt.arg_groups.overrides import record_foreign_defaults
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    def _resolve(argv: list[str]):
        record = parse(argv)
        algo = SpeculativeAlgorithm.from_string(record.speculative_algorithm)
        record_foreign_defaults(record, "handle_speculative_decoding.custom_validate", algo.validate_server_args)
        record_foreign_defaults(record, "handle_speculative_decoding.custom_algo", algo.handle_server_args)
        return record

    return _resolve


@pytest.fixture
def interpreter_bool_masks():
    """SGLang's kernel ANDs a loaded index's comparison with a vector mask; Triton 3.9's interpreter makes that an
    int64 array its load then refuses ('mask has unsupported dtype'). Cast such masks to bool (what a GPU does)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    import numpy as np
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_masked_load

    def load(self, ptrs, mask, other, cache_policy, is_volatile):
        if mask.data.dtype != np.bool_:
            mask = interpreter.TensorHandle(mask.data.astype(np.bool_), mask.dtype)
        return original(self, ptrs, mask, other, cache_policy, is_volatile)

    interpreter.InterpreterBuilder.create_masked_load = load
    yield
    interpreter.InterpreterBuilder.create_masked_load = original
