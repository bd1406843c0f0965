"""The one SSH seam: a Transport judges what `call` returns, and every host-facing command goes through it.

The stand-in overrides only `call` (the subprocess); what ddtree-ops does with the answers is real.
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from ddtree_ops.config import parse_project
from ddtree_ops.exceptions import HostError
from ddtree_ops.health import doctor
from ddtree_ops.health.check import run_healthcheck
from ddtree_ops.hosts.layout import STATE_PATH
from ddtree_ops.hosts.query import FOLLOW_UP_MARK
from ddtree_ops.hosts.ssh import Transport

PACKAGE = Path(__file__).resolve().parents[3] / "ddtree_ops"
MANIFEST = Path(__file__).resolve().parents[2] / "fixtures" / "manifests" / "h200-manifest.json"
ENV = "/opt/ddtree/envs/0123456789abcdef"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket closes


PROJECT = parse_project(
    {
        "hosts": [{"name": "h1", "address": "127.0.0.1", "ssh": {"port": 9}}],
        "engine": {"target": "lab", "draft": "lab"},
        "services": [{"name": "tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "port": _closed_port()}],
    },
    "test",
)


class Scripted(Transport):
    """Answers each command with the first scripted (prefix -> (rc, stdout, stderr)) that matches; records all."""

    def __init__(self, script: dict[str, tuple[int, str, str]] | None = None, raises: Exception | None = None):
        self.script, self.raises, self.commands = script or {}, raises, []

    def call(self, host, remote_command, *, timeout_s, input_text=None, stdin=None, connect_timeout_s=10):
        self.commands.append(remote_command)
        if self.raises is not None:
            raise self.raises
        for prefix, (rc, out, err) in self.script.items():
            if remote_command.startswith(prefix) or prefix in remote_command:
                return subprocess.CompletedProcess(remote_command, rc, out, err)
        return subprocess.CompletedProcess(remote_command, 1, "", "not scripted")


def test_exec_turns_ssh_failures_into_host_errors_naming_the_host():
    host = PROJECT.host("h1")
    with pytest.raises(HostError, match=r"h1 \(root@127.0.0.1:9\) is unreachable over SSH: Connection refused"):
        Scripted({"true": (255, "", "Connection refused")}).exec(host, "true", timeout_s=5)
    with pytest.raises(HostError, match=r"host h1 \(127.0.0.1\): the probe did not finish within 5s"):
        Scripted(raises=subprocess.TimeoutExpired("ssh", 5)).exec(host, "true", timeout_s=5, what="the probe")
    with pytest.raises(HostError, match="install openssh-client"):
        Scripted(raises=FileNotFoundError("ssh")).exec(host, "true", timeout_s=5)
    with pytest.raises(HostError, match=r"`false` exited 1: nope"):
        Scripted({"false": (1, "", "nope")}).run(host, "false")
    assert Scripted({"echo": (0, "hi\n", "")}).run(host, "echo hi") == "hi\n"


def test_healthcheck_reads_units_state_and_manifest_only_through_the_transport():
    state = json.dumps({"env": {"path": ENV}, "services": {}})
    transport = Scripted(
        {
            # One round trip: units and state.json by shell, then the host script's releases and manifest.
            "echo '### unit ddtree-tree.service'": (
                0,
                "### unit ddtree-tree.service\nActiveState=active\nSubState=running\nLoadState=loaded\nNRestarts=2\n"
                f"### state.json\n{state}\n### releases\n{FOLLOW_UP_MARK}\n{MANIFEST.read_text()}",
                "",
            ),
        }
    )
    report = run_healthcheck(PROJECT, timeout_s=1, transport=transport)
    (result,) = report.results
    assert result.unit is not None and result.unit.running and result.unit.restarts == 2
    assert result.manifest is not None and result.manifest.status == "ok" and result.manifest.env == ENV
    assert len(transport.commands) == 1  # one login per host: units, state.json, releases and manifest together
    assert f"cat {STATE_PATH}" in transport.commands[0] and "python3 -I - " in transport.commands[0]


def test_a_host_without_python3_is_named_and_the_healthcheck_reports_it():
    transport = Scripted({"echo '### unit": (127, "### unit ddtree-tree.service\n", "bash: python3: command not found")})
    (result,) = run_healthcheck(PROJECT, timeout_s=1, transport=transport).results
    assert not result.ok
    assert any("h1: python3 is not installed there" in f for f in result.failures)


def test_doctor_reaches_hosts_only_through_the_transport():
    transport = Scripted({"true": (255, "", "Connection refused")})
    checks = doctor.host_checks(PROJECT, PROJECT.host("h1"), connect_timeout_s=1, transport=transport)
    assert [(c.name, c.status) for c in checks] == [
        ("reachable", "fail"), ("probe", "skip"), ("lock", "skip"), ("manifest", "skip"), ("drift", "skip"),
    ]  # fmt: skip
    assert "unreachable over SSH (root@127.0.0.1:9): Connection refused" in checks[0].detail
    assert transport.commands == ["true"]


def test_no_module_but_the_seam_builds_an_ssh_command_line():
    builders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "host_scripts" not in path.parts and ("ssh_argv(" in path.read_text() or '["ssh"' in path.read_text())
    ]
    assert builders == ["hosts/ssh.py"]
