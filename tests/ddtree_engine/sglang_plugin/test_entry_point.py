"""The plugin is found through SGLang's entry-point group in a fresh process, and refuses any
SGLang release but the pinned one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata

import pytest

FRESH_PROCESS = r"""
import json
from importlib import metadata
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
try:
    SpeculativeAlgorithm.from_string("DDTREE")
    before = "known"
except ValueError as exc:
    before = str(exc)
from sglang.srt.plugins import load_plugins
load_plugins()
import sglang.srt.server_args as server_args_module
algo = SpeculativeAlgorithm.from_string("DDTREE")
print(json.dumps({
    "before": before,
    "class": type(algo).__module__ + "." + type(algo).__qualname__,
    "is_dflash": algo.is_dflash(),
    "server_args": server_args_module.ServerArgs.__module__ + "." + server_args_module.ServerArgs.__qualname__,
    "entry_points": {ep.name: ep.value for ep in metadata.entry_points(group="sglang.srt.plugins")},
}))
"""


def test_sglang_discovers_the_plugin_in_a_fresh_process():
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_PLUGINS"}
    proc = subprocess.run([sys.executable, "-c", FRESH_PROCESS], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    # Unknown until SGLang's loader runs the entry point: discovery is what registers it.
    assert seen["before"] == "Unknown speculative algorithm name: DDTREE"
    assert seen["class"] == "ddtree_engine.sglang_plugin.spec.DDTreeSpecAlgo" and seen["is_dflash"] is True
    assert seen["server_args"] == "ddtree_engine.sglang_plugin.flags.DDTreeServerArgs"
    # The name carries "ddtree": ddtree-ops' host manifest check looks for it.
    assert seen["entry_points"] == {"ddtree": "ddtree_engine.sglang_plugin:register"}


def test_the_installed_sglang_is_the_pinned_release(sglang_plugin):
    assert metadata.version("sglang") == sglang_plugin.SUPPORTED_SGLANG_VERSION == "0.5.23"
    assert sglang_plugin.check_sglang_version() == "0.5.23"


@pytest.mark.parametrize(
    ("found", "said"),
    [("0.5.24", "sglang 0.5.24 is installed"), ("0.5.22", "sglang 0.5.22 is installed"), (None, "sglang is not installed")],
)
def test_register_refuses_any_other_release_saying_what_to_do(sglang_plugin, monkeypatch, found, said):
    monkeypatch.setattr(sglang_plugin, "installed_sglang_version", lambda: found)
    with pytest.raises(sglang_plugin.SGLangVersionError) as refused:
        sglang_plugin.register()
    message = str(refused.value)
    assert said in message
    assert "it supports only sglang 0.5.23" in message
    assert "Install sglang==0.5.23" in message
    assert refused.value.exit_code == 2


def test_register_is_idempotent_in_one_process(sglang_plugin):
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algo = SpeculativeAlgorithm.from_string("DDTREE")
    hooks = {target: len(entries) for target, entries in HookRegistry._hooks.items()}
    sglang_plugin.register()  # load_plugins() already ran it in this process
    assert SpeculativeAlgorithm.from_string("DDTREE") is algo
    assert {target: len(entries) for target, entries in HookRegistry._hooks.items()} == hooks
