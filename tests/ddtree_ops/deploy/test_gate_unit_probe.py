"""The gate's reading of `systemctl show`: a crash loop into the start limit is named with the limit.

The properties are what the lab's systemd (Debian 12, systemd 252) showed for a service whose
engine exits 2 at every start (tests/ddtree_ops/lab/test_faults_lab.py runs that for real).
"""

from __future__ import annotations

import subprocess

from ddtree_ops.config import parse_project
from ddtree_ops.deploy.gate import GateTarget, systemd_unit_probe, unit_given_up
from ddtree_ops.hosts.ssh import Transport

CRASH_LOOPED = {
    "ActiveState": "failed", "SubState": "failed", "Result": "exit-code", "NRestarts": "5",
    "StartLimitBurst": "5", "StartLimitIntervalUSec": "10min",
}  # fmt: skip


def test_a_unit_that_used_up_its_restarts_is_named_with_its_start_limit():
    why = unit_given_up("ddtree-tree.service", CRASH_LOOPED)
    assert why is not None
    assert "crash-looped into its start limit (StartLimitBurst=5 starts within StartLimitIntervalSec=10min" in why
    assert "5 restarts, Result=exit-code" in why and "will not restart it again" in why


def test_start_limit_hit_as_the_result_is_named_too():
    why = unit_given_up("ddtree-tree.service", {**CRASH_LOOPED, "Result": "start-limit-hit", "NRestarts": "0"})
    assert why is not None and "crash-looped into its start limit" in why and "Result=start-limit-hit" in why


def test_a_failed_unit_below_its_burst_is_not_called_a_crash_loop():
    why = unit_given_up("ddtree-tree.service", {**CRASH_LOOPED, "NRestarts": "1"})
    assert why == "systemd gave up on ddtree-tree.service (failed/failed after 1 restarts, Result=exit-code)"


def test_a_unit_between_crash_and_restart_is_still_waited_for():
    waiting = {**CRASH_LOOPED, "ActiveState": "activating", "SubState": "auto-restart", "NRestarts": "3"}
    assert unit_given_up("ddtree-tree.service", waiting) is None
    assert unit_given_up("ddtree-tree.service", {**CRASH_LOOPED, "ActiveState": "active", "SubState": "running"}) is None


class Systemd(Transport):
    def __init__(self, props: dict[str, str]):
        self.props, self.commands = props, []

    def call(self, host, remote_command, *, timeout_s, input_text=None, stdin=None, connect_timeout_s=10):
        self.commands.append(remote_command)
        out = "".join(f"{k}={v}\n" for k, v in self.props.items())
        return subprocess.CompletedProcess(remote_command, 0, out, "")


def test_the_probe_asks_systemd_for_the_limit_and_the_result():
    project = parse_project({
        "hosts": [{"name": "h1", "address": "127.0.0.1"}],
        "engine": {"target": "lab", "draft": "lab"},
        "services": [{"name": "tree", "algorithm": "ddtree", "port": 30001, "budget": 15, "topk": 8}],
    })  # fmt: skip
    systemd = Systemd(CRASH_LOOPED)
    why = systemd_unit_probe(project, systemd)(GateTarget("h1", "tree", "http://127.0.0.1:30001", None))
    assert why is not None and "StartLimitBurst=5" in why
    (command,) = systemd.commands
    assert command.startswith("systemctl show -p ") and command.endswith(" ddtree-tree.service")
    for prop in ("Result", "NRestarts", "StartLimitBurst", "StartLimitIntervalUSec"):
        assert prop in command


class Flaky(Systemd):
    """Answers with `props`, except while `down` is set: then ssh's own 'unreachable' (exit 255)."""

    def __init__(self, props):
        super().__init__(props)
        self.down = False

    def call(self, host, remote_command, *, timeout_s, input_text=None, stdin=None, connect_timeout_s=10):
        if self.down:
            return subprocess.CompletedProcess(remote_command, 255, "", "ssh: connect to host 127.0.0.1 port 22: No route to host")
        return super().call(host, remote_command, timeout_s=timeout_s)


def test_a_host_unreachable_for_three_probes_in_a_row_ends_the_wait_and_one_blip_does_not():
    project = parse_project({
        "hosts": [{"name": "h1", "address": "127.0.0.1"}],
        "engine": {"target": "lab", "draft": "lab"},
        "services": [{"name": "tree", "algorithm": "ddtree", "port": 30001, "budget": 15, "topk": 8}],
    })  # fmt: skip
    starting = {**CRASH_LOOPED, "ActiveState": "activating", "SubState": "start", "NRestarts": "0"}
    ssh = Flaky(starting)
    probe = systemd_unit_probe(project, ssh)
    target = GateTarget("h1", "tree", "http://127.0.0.1:30001", None)
    ssh.down = True
    assert probe(target) is None and probe(target) is None, "two misses are a blip"
    ssh.down = False
    assert probe(target) is None, "an answer resets the count"
    ssh.down = True
    assert probe(target) is None and probe(target) is None
    why = probe(target)
    assert why is not None and why.startswith("host h1 stopped answering (SSH and HTTP) while ddtree-tree.service was starting")
    assert "unreachable over SSH" in why and "No route to host" in why
