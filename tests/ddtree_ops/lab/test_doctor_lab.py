"""doctor on real lab hosts: a fresh fleet, a provisioned env (manifest and drift), a tampered env, a dead host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ddtree_ops.cli import cli
from ddtree_ops.config import load_project
from ddtree_ops.hosts.ssh import SSH

pytestmark = [pytest.mark.lab]



def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def rows_of(result) -> dict:
    return {(c["scope"], c["name"]): c for c in json.loads(result.stdout)["checks"]}


def test_doctor_against_the_lab_hosts(lab_fleet):
    result = invoke("-c", str(lab_fleet.config_path), "doctor", "--json")
    rows = rows_of(result)
    failed = [c for c in rows.values() if c["status"] == "fail"]
    assert result.exit_code == 0 and not failed, failed
    assert rows[("control", "ssh key")]["status"] == "ok"
    for host in ("lab-1", "lab-2"):
        assert rows[(host, "reachable")]["status"] == "ok"
        assert rows[(host, "probe")]["status"] == "ok" and "no GPU" in rows[(host, "probe")]["detail"]
        assert rows[(host, "lock")]["status"] == "ok" and rows[(host, "lock")]["detail"].startswith("env ")
        assert rows[(host, "drift")]["status"] in ("ok", "warn")


@pytest.mark.slow
def test_provisioned_env_passes_then_tampering_is_drift(lab_fleet):
    config = str(lab_fleet.config_path)
    provisioned = invoke("-c", config, "provision", "lab-1")
    assert provisioned.exit_code == 0, provisioned.output
    result = invoke("-c", config, "doctor", "lab-1", "--json")
    rows = rows_of(result)
    assert result.exit_code == 0, rows
    assert rows[("lab-1", "manifest")]["status"] == "ok" and rows[("lab-1", "manifest")]["detail"].startswith("ok: torch ")
    assert rows[("lab-1", "drift")]["status"] == "ok"

    # Hide one pinned distribution's metadata (its code stays, so nothing else on the host breaks) and restore it.
    host = load_project(config).host("lab-1")
    env = "/opt/ddtree/envs/" + rows[("lab-1", "lock")]["detail"].split()[1]
    dist_info = SSH.run(host, f"ls -d {env}/lib/python3*/site-packages/filelock-*.dist-info").strip()
    SSH.run(host, f"mv {dist_info} {dist_info}.hidden")
    try:
        tampered = invoke("-c", config, "doctor", "lab-1", "--no-manifest")
        assert tampered.exit_code == 1
        line = next(l for l in tampered.stdout.splitlines() if " lab-1 " in l and " drift " in l)
        assert line.startswith("FAIL") and "filelock missing (lock " in line
    finally:
        SSH.run(host, f"mv {dist_info}.hidden {dist_info}")
    assert invoke("-c", config, "doctor", "lab-1", "--no-manifest").exit_code == 0


def test_doctor_names_a_lab_host_that_stopped_answering(lab_fleet, tmp_path):
    # The lab's own project plus one host that does not exist: the lab host passes, that one fails.
    project = yaml.safe_load(Path(lab_fleet.config_path).read_text())
    key = project["hosts"][0].get("ssh", {}).get("key")
    project["hosts"].append({"name": "gone", "address": "192.0.2.77", "ssh": {"key": key} if key else {}})
    config = tmp_path / "ddtree.yaml"
    config.write_text(yaml.safe_dump(project))
    result = invoke("-c", str(config), "doctor", "--no-manifest", "--connect-timeout", "2", "lab-1", "gone")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert any(l.startswith("ok") and " lab-1 " in l and "reachable" in l for l in lines)
    assert any(l.startswith("FAIL") and " gone " in l and "unreachable" in l for l in lines)


def test_probe_through_ansible_and_ssh_agree(lab_fleet):
    from ddtree_ops.hosts.probe import probe_host, probe_hosts_ansible

    project = load_project(str(lab_fleet.config_path))
    by_ansible = probe_hosts_ansible(project, project.hosts)
    assert set(by_ansible) == {"lab-1", "lab-2"}
    for host in project.hosts:
        facts = by_ansible[host.name]
        assert facts.gpus == () and facts.nvml_state == "no-driver" and facts.os_id == "debian"
        over_ssh = probe_host(host)
        assert (facts.python_version, facts.glibc, facts.hostname) == (over_ssh.python_version, over_ssh.glibc, over_ssh.hostname)
