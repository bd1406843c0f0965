"""doctor on real lab hosts: a fresh fleet, a provisioned env (manifest and drift), a tampered env, a swapped
build, a dead host."""

from __future__ import annotations

import json
import socket
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ddtree_ops.cli import cli
from ddtree_ops.config import load_project
from ddtree_ops.hosts.layout import ENVS_DIR
from ddtree_ops.hosts.ssh import SSH

pytestmark = [pytest.mark.lab]


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def rows_of(result) -> dict:
    return {(c["scope"], c["name"]): c for c in json.loads(result.stdout)["checks"]}


def lock_of(config: str, host_name: str) -> dict:
    """The lock `provision --plan` gives the host (what doctor checks the env against)."""
    planned = invoke("-c", config, "provision", "--plan", "--json", host_name)
    assert planned.exit_code == 0, planned.output
    (entry,) = json.loads(planned.stdout)["hosts"]
    return entry["lock"]


def pins_of(lock: dict) -> dict[str, str]:
    return dict(line.split("==", 1) for line in lock["requirements"])


def drift_of(result, host_name: str) -> tuple[str, str]:
    row = rows_of(result)[(host_name, "drift")]
    return row["status"], row["detail"]


@contextmanager
def installed_version_rewritten(host, env: str, dist: str, version: str):
    """Rewrite the Version header of `dist`'s installed metadata in `env`, and put the original back afterwards.

    This simulates a swapped build: what `pip install` of another build of the same release leaves in
    the env's metadata (the version importlib.metadata reports). The package's code is not touched, so
    nothing else on the host changes. Only the first `Version:` line is the header; the description
    below it could hold another.
    """
    metadata = SSH.run(host, f"ls {env}/lib/python3*/site-packages/{dist}-*.dist-info/METADATA").strip()
    SSH.run(host, f"cp -p {metadata} {metadata}.orig && sed -i '0,/^Version: /s/^Version: .*/Version: {version}/' {metadata}")
    try:
        yield
    finally:
        SSH.run(host, f"mv {metadata}.orig {metadata}")


def test_doctor_against_the_lab_hosts(lab_fleet):
    config = str(lab_fleet.config_path)
    result = invoke("-c", config, "doctor", "--json")
    rows = rows_of(result)
    failed = [c for c in rows.values() if c["status"] == "fail"]
    assert result.exit_code == 0 and not failed, failed
    assert rows[("control", "ssh key")]["status"] == "ok"
    project = load_project(config)
    for name in ("lab-1", "lab-2"):
        assert rows[(name, "reachable")]["status"] == "ok"
        assert rows[(name, "probe")]["status"] == "ok" and "no GPU" in rows[(name, "probe")]["detail"]
        lock = lock_of(config, name)
        short = lock["short_hash"]
        assert (rows[(name, "lock")]["status"], rows[(name, "lock")]["detail"]) == ("ok", f"env {short}")
        # Whether another lab module provisioned this host already decides the row; read it off the host.
        present = SSH.run(project.host(name), f"ls -1 {ENVS_DIR} 2>/dev/null || true").split()
        if short in present:
            expected = ("ok", f"{ENVS_DIR}/{short}: {len(lock['requirements'])} pinned packages match")
        else:
            others = f"; the host has {', '.join(present)}" if present else ""
            expected = ("warn", f"the lock's env {short} is not on the host{others} — run ddtree-ops provision --hosts {name}")
        assert (rows[(name, "drift")]["status"], rows[(name, "drift")]["detail"]) == expected


@pytest.mark.slow
def test_provisioned_env_passes_then_tampering_is_drift(lab_fleet):
    config = str(lab_fleet.config_path)
    provisioned = invoke("-c", config, "provision", "lab-1")
    assert provisioned.exit_code == 0, provisioned.output
    lock = lock_of(config, "lab-1")
    env = f"{ENVS_DIR}/{lock['short_hash']}"
    result = invoke("-c", config, "doctor", "lab-1", "--json")
    rows = rows_of(result)
    assert result.exit_code == 0, rows
    assert rows[("lab-1", "manifest")]["status"] == "ok" and rows[("lab-1", "manifest")]["detail"].startswith("ok: torch ")
    assert drift_of(result, "lab-1") == ("ok", f"{env}: {len(lock['requirements'])} pinned packages match")

    # Hide one pinned distribution's metadata (its code stays, so nothing else on the host breaks) and restore it.
    host = load_project(config).host("lab-1")
    dist_info = SSH.run(host, f"ls -d {env}/lib/python3*/site-packages/filelock-*.dist-info").strip()
    SSH.run(host, f"mv {dist_info} {dist_info}.hidden")
    try:
        tampered = invoke("-c", config, "doctor", "lab-1", "--no-manifest", "--json")
        assert tampered.exit_code == 1
        assert drift_of(tampered, "lab-1") == (
            "fail",
            f"{env} differs from its lock: missing: filelock (lock pins {pins_of(lock)['filelock']})",
        )
    finally:
        SSH.run(host, f"mv {dist_info}.hidden {dist_info}")
    assert invoke("-c", config, "doctor", "lab-1", "--no-manifest").exit_code == 0


@pytest.mark.slow
def test_swapped_torch_build_is_drift_and_exits_1(lab_fleet):
    config = str(lab_fleet.config_path)
    assert invoke("-c", config, "provision", "lab-1").exit_code == 0  # a no-op when the previous test provisioned it
    lock = lock_of(config, "lab-1")
    env, pins = f"{ENVS_DIR}/{lock['short_hash']}", pins_of(lock)
    host = load_project(config).host("lab-1")
    matching = ("ok", f"{env}: {len(pins)} pinned packages match")
    assert drift_of(invoke("-c", config, "doctor", "lab-1", "--no-manifest", "--json"), "lab-1") == matching

    # The lab's lock pins torch as one build (2.13.0+cpu): the host gets another build of the same release.
    release, _, build = pins["torch"].partition("+")
    assert build, f"the lab's lock pins torch without a local version ({pins['torch']}): no build to swap"
    swapped = f"{release}+{'cu130' if build != 'cu130' else 'cu128'}"
    with installed_version_rewritten(host, env, "torch", swapped):
        result = invoke("-c", config, "doctor", "lab-1", "--no-manifest", "--json")
        assert result.exit_code == 1, result.output
        assert drift_of(result, "lab-1") == (
            "fail",
            f"{env} differs from its lock: wrong build: torch {swapped} installed, lock pins {pins['torch']}",
        )
        assert [k for k, c in rows_of(result).items() if c["status"] == "fail"] == [("lab-1", "drift")]
        line = next(l for l in invoke("-c", config, "doctor", "lab-1", "--no-manifest").stdout.splitlines() if " drift " in l)
        assert line.startswith("FAIL") and line.endswith(f"wrong build: torch {swapped} installed, lock pins {pins['torch']}")

    # filelock is pinned as a release (no local part): a local build of that release is still what the lock says.
    assert "+" not in pins["filelock"]
    with installed_version_rewritten(host, env, "filelock", f"{pins['filelock']}+deb12"):
        result = invoke("-c", config, "doctor", "lab-1", "--no-manifest", "--json")
        assert result.exit_code == 0 and drift_of(result, "lab-1") == matching
    assert drift_of(invoke("-c", config, "doctor", "lab-1", "--no-manifest", "--json"), "lab-1") == matching


def test_doctor_names_a_lab_host_that_stopped_answering(lab_fleet, tmp_path):
    # The lab's own project plus one host that does not exist: the lab host passes, that one fails.
    project = yaml.safe_load(Path(lab_fleet.config_path).read_text())
    key = project["hosts"][0].get("ssh", {}).get("key")
    # A closed port on 127.0.0.1 stands in for a host that stopped answering (loopback only: tests
    # never send traffic to any other address).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    gone_ssh = {"port": closed_port, **({"key": key} if key else {})}
    project["hosts"].append({"name": "gone", "address": "127.0.0.1", "ssh": gone_ssh})
    # Written elsewhere, it keeps checking host keys against the lab's known_hosts (beside the lab's file).
    project["ssh"] = {**project.get("ssh", {}), "known_hosts": str(Path(lab_fleet.config_path).with_name("known_hosts"))}
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
