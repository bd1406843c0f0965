"""The control side of the ABI manifest: validation, the deploy gate, and the remote command (run locally)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_ops import manifest
from ddtree_ops.exceptions import CheckFailed, ConfigError
from ddtree_ops.probe import MANIFEST_SCRIPT

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "manifests" / "h200-manifest.json"


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
