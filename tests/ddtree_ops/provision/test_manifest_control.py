"""The control side of the ABI manifest: validation, the deploy gate, and the remote command (run locally)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ddtree_ops.provision import manifest
from ddtree_ops.exceptions import CheckFailed, ConfigError
from ddtree_ops.hosts.probe import MANIFEST_SCRIPT

from manifest_docs import H200_MANIFEST as FIXTURE
from manifest_docs import failed_manifest_doc


def test_real_h200_manifest_parses_and_passes_the_gate():
    m = manifest.load_manifest(FIXTURE)
    assert m.ok and m.torch_cuda == "13.0" and m.driver_version.startswith("580.")
    assert m.summary().startswith("ok: torch 2.11.0+cu130 (CUDA 13.0), driver 580.")
    manifest.gate(m, "h200")  # does not raise


def test_failed_manifest_stops_deploy_with_the_reason():
    doc = json.loads(FIXTURE.read_text())
    doc["checks"].append({"name": "import:sgl_kernel", "status": "fail", "ok": False, "class": "torch-abi-mismatch", "reason": "undefined symbol: _ZN3c10x"})
    doc["ok"] = False
    m = manifest.parse_manifest(doc)
    with pytest.raises(CheckFailed, match=r"host gpu-1: the env's ABI manifest failed — import:sgl_kernel: torch-abi-mismatch: undefined symbol"):
        manifest.gate(m, "gpu-1")


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda d: d.update(format=3), "manifest format 3"),
        (lambda d: d.update(checks=[]), "'checks' must be a non-empty list"),
        (lambda d: d["checks"][0].update(status="great"), "checks[0] needs a name and a status"),
        (lambda d: d["checks"][0].update(status="fail"), "'ok' is True but the checks say False"),
    ],
)
def test_malformed_manifest_is_refused(mutate, fragment):
    doc = json.loads(FIXTURE.read_text())
    mutate(doc)
    with pytest.raises(ConfigError) as err:
        manifest.parse_manifest(doc)
    assert fragment in str(err.value)


def test_remote_command_runs_the_script_from_stdin_and_stores_the_manifest(tmp_path):
    # The exact shell command SSH would run, run by a local shell: the script arrives on stdin.
    stored = tmp_path / "abi-manifest.json"
    cmd = manifest.remote_command(sys.executable, manifest.manifest_args("reference", {"pytest": "0.0.1"}, "none"), str(stored))
    proc = subprocess.run(["sh", "-c", cmd], input=MANIFEST_SCRIPT.read_text(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr  # pytest is pinned to a version that is not installed
    m = manifest.parse_manifest(json.loads(proc.stdout))
    failed = {c.name: c.failure_class for c in m.failures}
    assert failed["packages"] == "drift"
    assert json.loads(stored.read_text())["ok"] is False


def test_run_local_with_this_interpreter():
    m = manifest.run_local(sys.executable, backend="none", expect_gpu_arch="none")
    assert m.ok, m.summary()


# --- the manifest stored beside a host's env: what deploy and healthcheck read ----------------------


def test_stored_manifest_that_passed_lets_deploy_through():
    verdict = manifest.verdict_from_text("gpu-1", "/opt/ddtree/envs/abc", FIXTURE.read_text())
    assert verdict.status == "ok" and verdict.ok and verdict.short() == "ok"
    assert verdict.refusal() is None
    assert verdict.to_dict()["summary"].startswith("ok: torch 2.11.0+cu130")


def test_stored_manifest_that_failed_names_the_host_env_and_each_failed_check():
    verdict = manifest.verdict_from_text("lab-2", "/opt/ddtree/envs/abc", json.dumps(failed_manifest_doc()))
    assert verdict.status == "failed" and not verdict.ok
    assert verdict.short() == "failed: import:ddtree_engine.reference.engine"
    refusal = verdict.refusal()
    assert refusal.startswith("host 'lab-2': the engine environment /opt/ddtree/envs/abc failed its ABI manifest:")
    assert "import:ddtree_engine.reference.engine — importing ddtree_engine.reference.engine needs the Python module 'safetensors'" in refusal
    assert "(missing-python-dependency)" in refusal
    assert "run `ddtree-ops provision lab-2`" in refusal


@pytest.mark.parametrize(
    "text, status, fragment",
    [
        ("", "missing", "has no ABI manifest (no /opt/ddtree/envs/abc/abi-manifest.json)"),
        ("{not json", "invalid", "/opt/ddtree/envs/abc/abi-manifest.json is not JSON"),
        ('{"format": 9}', "invalid", "manifest format 9 is not supported"),
    ],
)
def test_missing_or_unreadable_stored_manifest_refuses_deploy(text, status, fragment):
    verdict = manifest.verdict_from_text("gpu-1", "/opt/ddtree/envs/abc", text)
    assert verdict.status == status and not verdict.ok
    assert fragment in verdict.refusal() and "ddtree-ops provision gpu-1" in verdict.refusal()


def test_env_path_comes_from_the_state_file_that_provision_writes():
    assert manifest.env_of_state({"env": {"path": "/opt/ddtree/envs/abc", "lock_hash": "x"}}) == "/opt/ddtree/envs/abc"
    assert manifest.env_of_state({"services": {}}) is None
    assert manifest.env_of_state(None) is None
    no_env = manifest.EnvVerdict("gpu-1", None, "missing", problem="no env recorded")
    assert "has no engine environment recorded" in no_env.refusal()


def test_lock_pins_and_the_reference_backend_imports_the_engine_it_serves_with():
    assert manifest.lock_pins(["torch==2.13.0+cpu", "ddtree-engine==0.1.0", "weird"]) == {
        "torch": "2.13.0+cpu",
        "ddtree-engine": "0.1.0",
    }
    args = manifest.manifest_args("reference")
    required = [args[i + 1] for i, a in enumerate(args) if a == "--require"]
    # `ddtree_engine` alone imports nothing heavy; the engine and server modules pull torch, transformers, safetensors.
    assert "ddtree_engine.reference.engine" in required and "ddtree_engine.server.app" in required
