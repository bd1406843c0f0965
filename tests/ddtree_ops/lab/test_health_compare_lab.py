"""healthcheck and compare against the deployed lab fleet (real hosts: systemd, sshd, the engine).

Needs the `lab_fleet` fixture (tests/ddtree_ops/conftest.py), which brings the lab up and yields
its description; this module provisions and deploys on it (both are idempotent) before checking.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from click.testing import CliRunner

from ddtree_ops.cli import cli
from ddtree_ops.config import load_project
from ddtree_ops.health.check import run_healthcheck
from ddtree_ops.hosts.ssh import ssh_argv

pytestmark = pytest.mark.lab

RECOVERY_TIMEOUT_S = 600  # a restarted service reloads its model before /health says 200


def _run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def deployed_lab(lab_fleet):
    config = str(lab_fleet.config_path)
    provision = _run("-c", config, "provision")
    assert provision.exit_code == 0, provision.output
    deploy = _run("-c", config, "deploy", "--budget", "15", "--topk", "8")
    assert deploy.exit_code == 0, deploy.output
    return config, load_project(config)


def _on_host(project, host: str, command: str) -> None:
    subprocess.run(ssh_argv(project.host(host), command), check=True, capture_output=True, timeout=60)


def _wait_until_healthy(project, host: str) -> None:
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while True:
        report = run_healthcheck(project, [host], timeout_s=30)
        if report.ok:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{host} did not recover within {RECOVERY_TIMEOUT_S}s: {report.failures()}")
        time.sleep(3)


def test_healthcheck_passes_on_the_deployed_lab(deployed_lab):
    config, project = deployed_lab
    r = _run("-c", config, "healthcheck", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["systemd_checked"]
    assert doc["command"] == "healthcheck" and doc["failures"] == []
    assert [h["host"] for h in doc["hosts"]] == [h.name for h in project.hosts]
    services = [s for h in doc["hosts"] for s in h["services"]]
    assert len(services) == len(project.hosts) * len(project.services)
    for s in services:
        assert s["unit"]["active_state"] == "active" and s["unit"]["sub_state"] == "running"
        # The probe's own steps: a speculative arm commits at least one token per verify step.
        assert s["accept_length_recent"] is not None and s["accept_length_recent"] >= 1.0
        assert s["health_status"] == 200 and s["info_mismatches"] == []
        assert s["generation_tokens"] >= 1
        if s["service"] == "tree":
            assert s["expected_info"]["speculative_ddtree_budget"] == 15
            assert s["expected_info"]["speculative_ddtree_topk"] == 8


def test_compare_on_the_lab(deployed_lab, tmp_path):
    config, project = deployed_lab
    prompts = tmp_path / "prompts.yaml"
    prompts.write_text("- name: code\n  prompt: Write a Python function that adds two numbers.\n- What is 2+2?\n")
    out = tmp_path / "report"
    r = _run("-c", config, "compare", "--prompts", str(prompts), "--runs", "1", "--max-tokens", "16", "--out", str(out), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert sorted(doc["settings"]["hosts"]) == sorted(h.name for h in project.hosts)
    assert (doc["settings"]["budget"], doc["settings"]["topk"], doc["settings"]["block_size"]) == (15, 8, 16)
    assert any("--runs 1" in w for w in doc["warnings"])
    assert "budget 15, topk 8, block size 16" in (out / "compare.md").read_text()
    assert all(p["lossless"]["ok"] for p in doc["prompts"])
    assert all(run["completion_tokens"] == run["generation_tokens_delta"] for run in doc["runs"])
    assert (out / "compare.png").exists() and (out / "compare.md").exists()


def test_healthcheck_names_a_killed_service(deployed_lab):
    config, project = deployed_lab
    host = project.hosts[0].name
    try:
        _on_host(project, host, "systemctl kill -s KILL ddtree-tree.service")
        # Between the kill and the reloaded model the unit is in auto-restart or /health is 503.
        r = _run("-c", config, "healthcheck", "--hosts", host)
        assert r.exit_code == 1, r.output
        failed = r.output.split("healthcheck failed:")[1]
        assert f"{host}/tree: " in failed
        assert f"{host}/baseline: " not in failed
    finally:
        _wait_until_healthy(project, host)


def test_healthcheck_names_a_stopped_service(deployed_lab):
    # `systemctl mask` cannot mask a unit whose file lives in /etc/systemd/system, so: stop it.
    config, project = deployed_lab
    host = project.hosts[-1].name
    try:
        _on_host(project, host, "systemctl stop ddtree-tree.service")
        r = _run("-c", config, "healthcheck", "--json")
        assert r.exit_code == 1, r.output
        doc = json.loads(r.stdout)
        assert any(
            (f["host"], f["service"]) == (host, "tree") and f["message"].startswith("unit: ddtree-tree.service is inactive/dead")
            for f in doc["failures"]
        ), doc["failures"]
        others = [f for f in doc["failures"] if (f["host"], f["service"]) != (host, "tree")]
        assert others == []
    finally:
        _on_host(project, host, "systemctl start ddtree-tree.service")
        _wait_until_healthy(project, host)
