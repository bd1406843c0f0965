"""The ABI manifest on real lab hosts: provision stores it beside the env, a broken env fails it,
and deploy then stops at that host with the failed check while the host before it deploys.

The breakage is real: the `safetensors` package is moved out of lab-2's env (its metadata stays,
as after a half-finished cleanup), so the engine no longer imports there. It is moved back at the
end, and provision verifies the env again.
"""

from __future__ import annotations

import json

import httpx
import pytest
from click.testing import CliRunner

from ddtree_ops.cli import cli
from ddtree_ops.config import load_project
from ddtree_ops.hosts.ssh import SSH

pytestmark = [pytest.mark.lab, pytest.mark.slow]

BROKEN_MODULE = "ddtree_engine.reference.engine"
BROKEN_CHECK = f"import:{BROKEN_MODULE}"



def _run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_a_broken_env_fails_its_manifest_and_deploy_stops_at_that_host(lab_fleet):
    config = str(lab_fleet.config_path)
    project = load_project(config)
    lab1, lab2 = project.host("lab-1"), project.host("lab-2")

    provisioned = _run("-c", config, "provision", "--json")
    assert provisioned.exit_code == 0, provisioned.output
    rows = {row["host"]: row for row in json.loads(provisioned.stdout)["hosts"]}
    assert {h: r["manifest"] for h, r in rows.items()} == {"lab-1": "ok", "lab-2": "ok"}
    env = rows["lab-2"]["env"]
    stored = json.loads(SSH.run(lab2, f"cat {env}/abi-manifest.json"))
    assert stored["ok"] is True and stored["python"]["prefix"] == env
    assert {c["name"]: c["status"] for c in stored["checks"]}[BROKEN_CHECK] == "ok"

    package = SSH.run(lab2, f"ls -d {env}/lib/python3*/site-packages/safetensors").strip()
    aside = f"{env}/safetensors.moved-aside-by-test"
    state_before = SSH.run(lab2, "cat /var/lib/ddtree/state.json")
    SSH.run(lab2, f"mv {package} {aside}")
    try:
        reverified = _run("-c", config, "provision", "lab-2", "--json")
        assert reverified.exit_code == 1, reverified.output
        (row,) = json.loads(reverified.stdout)["hosts"]
        assert row["manifest"].startswith("failed: ") and BROKEN_CHECK in row["manifest"]
        assert row["changed"] == 0, "verifying an env is no change to it"
        assert f"host 'lab-2': the engine environment {env} failed its ABI manifest" in reverified.stderr
        assert "'safetensors', which is not installed" in reverified.stderr
        stored = json.loads(SSH.run(lab2, f"cat {env}/abi-manifest.json"))
        assert stored["ok"] is False

        deployed = _run("-c", config, "deploy", "--json")
        assert deployed.exit_code == 1, deployed.output
        report = json.loads(deployed.stdout)
        assert [(h["host"], h["status"]) for h in report["hosts"]] == [("lab-1", "deployed"), ("lab-2", "refused")]
        assert "deploy stopped at host 'lab-2', which was not changed" in deployed.stderr
        assert f"{BROKEN_CHECK} — importing {BROKEN_MODULE} needs the Python module 'safetensors'" in deployed.stderr
        assert "run `ddtree-ops provision lab-2`" in deployed.stderr
        for service in project.services:
            assert httpx.get(f"http://{lab1.address}:{service.port}/health", timeout=10).status_code == 200
        assert SSH.run(lab2, "cat /var/lib/ddtree/state.json") == state_before, "lab-2 must not be touched"

        health = _run("-c", config, "healthcheck", "--hosts", "lab-1,lab-2", "--json")
        manifests = {h["host"]: h["manifest"] for h in json.loads(health.stdout)["hosts"]}
        assert (manifests["lab-1"]["status"], manifests["lab-2"]["status"]) == ("ok", "failed")
        assert any(BROKEN_CHECK in line for line in manifests["lab-2"]["failures"])
        assert health.exit_code == 1
    finally:
        SSH.run(lab2, f"test -e {package} || mv {aside} {package}")

    restored = _run("-c", config, "provision", "lab-2", "--json")
    assert restored.exit_code == 0, restored.output
    assert json.loads(restored.stdout)["hosts"][0]["manifest"] == "ok"
    assert json.loads(SSH.run(lab2, f"cat {env}/abi-manifest.json"))["ok"] is True
