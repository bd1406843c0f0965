"""Faults during operations, on the lab fleet: real containers (systemd, sshd), real Ansible, the real engine.

Each test breaks one thing the way a real fleet does (sshd stopped, a host frozen, a service that
crash-loops, a service killed mid-compare, a full disk), checks that ddtree-ops names the host and
what happened, that the other host's work completes or nothing is changed, and puts the fleet
back as it found it (provisioned and deployed with budget 15, topk 8) in a `finally`.

Needs the `lab_fleet` fixture (tests/ddtree_ops/conftest.py); provision and deploy are idempotent,
so this module can run before or after the other lab modules.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml
from click.testing import CliRunner

import ddtree_ops.cli.compare as compare_cli
from ddtree_ops.cli import cli
from ddtree_ops.config import load_project
from ddtree_ops.exceptions import HostError
from ddtree_ops.health.check import run_healthcheck
from ddtree_ops.hosts.ssh import SSH

pytestmark = pytest.mark.lab

RECOVERY_TIMEOUT_S = 600  # a restarted service reloads its model before /health says 200
PROMPTS = "- name: code\n  prompt: Write a Python function that adds two numbers.\n- What is 2+2?\n"


def _run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _docker(*args: str, check: bool = True) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=120).stdout


def _in_container(container: str, command: str, check: bool = True) -> str:
    """A shell command inside a lab host without SSH (for when its sshd is stopped on purpose)."""
    return _docker("exec", container, "sh", "-c", command, check=check)


@pytest.fixture(scope="module")
def lab(lab_fleet):
    config = str(lab_fleet.config_path)
    provision = _run("-c", config, "provision")
    assert provision.exit_code == 0, provision.output
    deploy = _run("-c", config, "deploy", "--budget", "15", "--topk", "8")
    assert deploy.exit_code == 0, deploy.output
    project = load_project(config)
    assert [h.name for h in project.hosts] == ["lab-1", "lab-2"], "these tests need the two-host lab"
    containers = {h.name: h.container for h in lab_fleet.hosts}
    return config, project, containers


def _wait_until_healthy(project, *hosts: str) -> None:
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while True:
        report = run_healthcheck(project, list(hosts), timeout_s=30)
        if report.ok:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{hosts} did not recover within {RECOVERY_TIMEOUT_S}s: {report.failures()}")
        time.sleep(3)


REFUSE_SSH = "INPUT -p tcp --dport 22 -j REJECT --reject-with tcp-reset"


@contextmanager
def _sshd_stopped(container: str):
    """sshd stopped, and port 22 answered with a reset: new connections are refused, and so is the
    SSH master connection Ansible keeps open for 60 s (ControlPersist), which outlives sshd's stop."""
    _in_container(container, f"systemctl stop ssh && iptables -I {REFUSE_SSH}")
    try:
        yield
    finally:
        _in_container(container, f"iptables -D {REFUSE_SSH}; systemctl start ssh")


@contextmanager
def _paused(container: str):
    _docker("pause", container)
    try:
        yield
    finally:
        _docker("unpause", container)


def _host_files(container: str) -> str:
    """What provision and deploy own on a host, read without SSH: state.json, envs, units, env files."""
    return _in_container(
        container,
        "cat /var/lib/ddtree/state.json; ls -la --time-style=+%s /opt/ddtree/envs /etc/systemd/system/ddtree-*.service; "
        "ls /opt/ddtree/releases; md5sum /etc/ddtree/*.env /etc/systemd/system/ddtree-*.service",
    )


# ---- SSH refused / host unreachable --------------------------------------------------------------


def test_provision_with_sshd_stopped_on_one_host_changes_no_host(lab):
    config, _project, containers = lab
    before = {name: _host_files(c) for name, c in containers.items()}
    with _sshd_stopped(containers["lab-2"]):
        result = _run("-c", config, "provision", "--json")
    assert result.exit_code == 1, result.output
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "host" and error["exit_code"] == 1
    message = error["message"]
    assert message.startswith("no host was changed")
    assert "host lab-2 (" in message and "is unreachable over SSH" in message
    assert "check it is up and that `ssh -i " in message, "the message says what to try"
    assert "host lab-1" not in message, "lab-1 answered: it must not be blamed"
    assert {name: _host_files(c) for name, c in containers.items()} == before, "provision changed a host"


def test_healthcheck_with_one_host_frozen_reports_it_and_checks_the_other(lab):
    config, project, containers = lab
    with _paused(containers["lab-2"]):
        started = time.monotonic()
        result = _run("-c", config, "healthcheck", "--json")
        took = time.monotonic() - started
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert hosts["lab-1"]["ok"] is True, hosts["lab-1"]
    assert all(s["health_status"] == 200 and s["generation_tokens"] >= 1 for s in hosts["lab-1"]["services"])
    assert hosts["lab-2"]["ok"] is False
    assert {f["host"] for f in doc["failures"]} == {"lab-2"}
    services = {f["service"] for f in doc["failures"]}
    assert services == {s.name for s in project.services}, doc["failures"]
    for service in services:
        messages = [f["message"] for f in doc["failures"] if f["service"] == service]
        assert any(m.startswith("ssh: host lab-2 (") and "is unreachable over SSH" in m for m in messages), messages
        assert any(m.startswith("health: cannot reach http://") for m in messages), messages
    assert took < 150, f"healthcheck took {took:.0f}s with one host frozen: its checks must time out, not hang"


def test_compare_with_one_host_frozen_measures_the_other_and_exits_1(lab, tmp_path):
    config, project, containers = lab
    prompts = tmp_path / "prompts.yaml"
    prompts.write_text(PROMPTS)
    out = tmp_path / "report"
    with _paused(containers["lab-2"]):
        result = _run(
            "-c", config, "compare", "--prompts", str(prompts), "--runs", "1", "--max-tokens", "16",
            "--timeout", "20", "--out", str(out), "--json",
        )  # fmt: skip
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and json.loads((out / "compare.json").read_text())["ok"] is False
    # lab-1 was measured in full, and its outputs are lossless.
    assert {r["host"] for r in doc["runs"]} == {"lab-1"}
    assert len(doc["runs"]) == 2 * 2 and all(r["error"] is None for r in doc["runs"])
    assert all(p["lossless"]["ok"] for p in doc["prompts"]) and {p["host"] for p in doc["prompts"]} == {"lab-1"}
    # lab-2: each service named, not measured, with what to run.
    assert {(f["host"], f["service"]) for f in doc["failures"]} == {("lab-2", s.name) for s in project.services}
    assert all(f["message"].startswith("not measured: cannot reach http://") for f in doc["failures"])
    assert "ddtree-ops healthcheck --hosts lab-2" in doc["failures"][0]["message"]
    assert "compare failed:" in result.stderr and "lab-2/tree: not measured" in result.stderr


# ---- a service killed during compare -------------------------------------------------------------


def test_a_service_killed_during_compare_fails_that_run_and_the_others_complete(lab, tmp_path, monkeypatch):
    config, project, _containers = lab
    prompts = tmp_path / "prompts.yaml"
    prompts.write_text(PROMPTS)
    lab1 = project.host("lab-1")
    killed: list[str] = []
    say = compare_cli.say

    def say_and_kill(line: str) -> None:
        # The moment compare starts lab-1's first measured tree run, its engine process dies.
        if line == "lab-1/tree: code run 1/2" and not killed:
            pid = SSH.run(lab1, "systemctl show -p MainPID --value ddtree-tree.service").strip()
            SSH.run(lab1, f"kill -9 {pid}")
            killed.append(pid)
        say(line)

    monkeypatch.setattr(compare_cli, "say", say_and_kill)
    out = tmp_path / "report"
    try:
        result = _run(
            "-c", config, "compare", "--prompts", str(prompts), "--runs", "2", "--max-tokens", "16",
            "--timeout", "60", "--out", str(out), "--json",
        )  # fmt: skip
    finally:
        _wait_until_healthy(project, "lab-1")
    assert killed, "compare never started lab-1's first tree run"
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    runs = doc["runs"]
    assert len(runs) == 2 * 2 * 2 * 2, "every run of every prompt, arm and host was attempted"
    failed = [r for r in runs if r["error"]]
    first = next(r for r in runs if (r["host"], r["service"], r["prompt"], r["run"]) == ("lab-1", "tree", "code", 0))
    assert first["error"], "the run that met the killed service must be reported failed"
    assert {(r["host"], r["service"]) for r in failed} == {("lab-1", "tree")}
    assert all(r["error"] is None for r in runs if r["host"] == "lab-2" or r["service"] == "baseline")
    # Only lab-1/tree's runs are failures: a prompt whose tree runs all failed was compared with
    # nothing, which is not a lossless failure.
    assert {(f["host"], f["service"]) for f in doc["failures"]} == {("lab-1", "tree")}, doc["failures"]
    assert not [f for f in doc["failures"] if "lossless" in f["message"]]
    assert any("prompt 'code' run 0:" in f["message"] for f in doc["failures"])
    assert all(p["lossless"]["ok"] for p in doc["prompts"] if p["host"] == "lab-2")
    assert "lab-1/tree: prompt 'code' run 0" in result.stderr


# ---- a service that crash-loops until systemd's start limit --------------------------------------


def _server_info(project, host: str, service: str) -> dict:
    h, s = project.host(host), project.service(service)
    assert httpx.get(f"http://{h.address}:{s.port}/health", timeout=10).status_code == 200
    return httpx.get(f"http://{h.address}:{s.port}/server_info", timeout=10).json()


def test_a_crash_looping_service_is_named_with_its_start_limit_and_rolled_back(lab, tmp_path):
    config, project, containers = lab
    state_before = SSH.run(project.host("lab-1"), "cat /var/lib/ddtree/state.json")
    second_before = _host_files(containers["lab-2"])
    document = yaml.safe_load(Path(config).read_text())
    for service in document["services"]:
        if service["name"] == "tree":
            service["extra_args"] = ["--no-such-flag"]  # `ddtree-engine serve` exits 2 at once, every start
    # Long enough for 5 starts 10 s apart: the unit probe, not the timeout, must end the wait.
    document["deploy"] = {**document.get("deploy", {}), "health_timeout_s": 400, "health_interval_s": 1}
    # Written elsewhere, it keeps checking host keys against the lab's known_hosts (beside the lab's file).
    document["ssh"] = {**document.get("ssh", {}), "known_hosts": str(Path(config).with_name("known_hosts"))}
    bad_config = tmp_path / "ddtree.yaml"
    bad_config.write_text(yaml.safe_dump(document))

    started = time.monotonic()
    result = _run("-c", str(bad_config), "deploy", "--services", "tree", "--json")
    took = time.monotonic() - started
    assert result.exit_code == 1, result.output
    assert "deploy failed on host 'lab-1'" in result.stderr
    assert "crash-looped into its start limit (StartLimitBurst=5 starts within StartLimitIntervalSec=10min" in result.stderr
    assert "5 restarts" in result.stderr and "will not restart it again" in result.stderr
    assert "No such option '--no-such-flag'" in result.stderr, "the journal tail shows why it died"
    assert "host 'lab-1' rolled back: tree →" in result.stderr
    assert "lab-2 were not touched" in result.stderr
    assert took < 300, f"the gate waited {took:.0f}s: the start limit should end the wait, not the 400 s timeout"
    doc = json.loads(result.stdout)
    assert [h["status"] for h in doc["hosts"]] == ["rolled back", "skipped"]
    (failure,) = doc["failures"]
    assert (failure["host"], failure["service"]) == ("lab-1", "tree") and "start limit" in failure["message"]

    # lab-1 runs its previous release again, healthy; lab-2 was never reached.
    info = _server_info(project, "lab-1", "tree")
    assert (info["speculative_ddtree_budget"], info["speculative_ddtree_topk"]) == (15, 8)
    state_after = json.loads(SSH.run(project.host("lab-1"), "cat /var/lib/ddtree/state.json"))
    assert state_after["services"]["tree"]["current"] == json.loads(state_before)["services"]["tree"]["current"]
    assert _host_files(containers["lab-2"]) == second_before


# ---- disk full during provision ------------------------------------------------------------------


def test_disk_full_during_provision_leaves_no_half_built_env(lab):
    config, project, containers = lab
    lab2 = containers["lab-2"]
    state_before = _in_container(lab2, "cat /var/lib/ddtree/state.json")
    env = json.loads(state_before)["env"]["path"]
    # A 48 MB disk over the envs directory: the venv is created, its packages do not fit. It hides
    # the real env (the running services keep their open files) until it is unmounted.
    _in_container(lab2, "mount -t tmpfs -o size=48m ddtree-full /opt/ddtree/envs")
    try:
        result = _run("-c", config, "provision", "--hosts", "lab-2", "--json")
        left_in_envs = _in_container(lab2, "ls -A /opt/ddtree/envs")
        left_staging = _in_container(lab2, "ls -A /opt/ddtree/wheelhouse 2>/dev/null || true")
        state_during = _in_container(lab2, "cat /var/lib/ddtree/state.json")
    finally:
        _in_container(lab2, "umount /opt/ddtree/envs")
    assert result.exit_code == 1, result.output
    message = json.loads(result.stdout)["error"]["message"]
    assert "host lab-2 (" in message and f"building {env} failed at task" in message
    assert "No space left on device" in message
    assert "the partial environment was removed" in message
    assert left_in_envs == "", f"a half-built env was left: {left_in_envs!r}"
    assert left_staging == "", f"the copied wheelhouse was left: {left_staging!r}"
    assert state_during == state_before, "state.json must still name the env that was complete"
    # The real env is intact under the mount point, and a provision now finds it complete.
    assert _in_container(lab2, f"test -f {env}/.ddtree-complete && echo ok").strip() == "ok"
    again = _run("-c", config, "provision", "--hosts", "lab-2")
    assert again.exit_code == 0 and "lab-2: up to date" in again.stdout, again.output
    _wait_until_healthy(project, "lab-2")


# ---- ddtree-ops deploy itself killed mid-rollout -------------------------------------------------


def _children(pid: int) -> list[int]:
    """Every descendant of `pid` (from /proc), e.g. the ansible-playbook a deploy runs."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found += kids
        frontier += kids
    return found


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def _assert_ends(pids: list[int], message: str, timeout_s: float = 30) -> None:
    """Every one of `pids` ends within `timeout_s` (a task already running on a host may finish first)."""
    deadline = time.monotonic() + timeout_s
    while [pid for pid in pids if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [pid for pid in pids if _alive(pid)], message


def _deploy_killed(config: str, sig: int, *args: str) -> tuple[int, str, list[int]]:
    """Start `ddtree-ops deploy ARGS`, send `sig` a few seconds into lab-1's playbook; (rc, stderr, its children then)."""
    argv = [str(Path(sys.executable).with_name("ddtree-ops")), "-c", config, "deploy", *args]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("lab-1: deploying"):
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert started.wait(120), "deploy never started on lab-1:\n" + "".join(lines)
    time.sleep(4)  # inside lab-1's deploy playbook (it takes ~20 s on the lab)
    children = _children(proc.pid)
    assert children, "the deploy playbook should be running now"
    proc.send_signal(sig)
    try:
        rc = proc.wait(timeout=60 if sig == signal.SIGINT else 10)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    return rc, "".join(lines), children


def _converged(project, containers, budget: int, topk: int) -> None:
    """Every service healthy with these settings; each installed unit and env file is its current
    release's, byte for byte; no temp file left beside them."""
    for host in project.hosts:
        info = _server_info(project, host.name, "tree")
        assert (info["speculative_ddtree_budget"], info["speculative_ddtree_topk"]) == (budget, topk), host.name
        _server_info(project, host.name, "baseline")
        state = json.loads(SSH.run(host, "cat /var/lib/ddtree/state.json"))
        for service in ("baseline", "tree"):
            release = f"/opt/ddtree/releases/{state['services'][service]['current']}"
            SSH.run(host, f"cmp {release}/ddtree-{service}.service /etc/systemd/system/ddtree-{service}.service")
            SSH.run(host, f"cmp {release}/{service}.env /etc/ddtree/{service}.env")
        leftovers = _in_container(containers[host.name], "ls -A /etc/systemd/system /etc/ddtree /var/lib/ddtree | grep -i tmp || true")
        assert leftovers == "", f"{host.name}: temp files left: {leftovers!r}"


def test_deploy_interrupted_or_killed_mid_rollout_then_a_rerun_converges(lab):
    config, project, containers = lab
    second_before = _host_files(containers["lab-2"])

    # Ctrl-C: the playbook is cancelled (ansible-playbook killed, not left running), lab-1 is named
    # as interrupted with what to run, lab-2 is not touched, exit 1.
    rc, stderr, children = _deploy_killed(config, signal.SIGINT, "--budget", "7", "--topk", "4")
    assert rc == 1, stderr
    assert "deploy interrupted (Ctrl-C) on host 'lab-1'" in stderr, stderr
    assert "run the same `ddtree-ops deploy` again to converge" in stderr
    assert "host(s) lab-2 were not touched" in stderr
    assert "Traceback" not in stderr
    _assert_ends(children, "the cancelled playbook is still running")
    assert _host_files(containers["lab-2"]) == second_before

    # The same deploy again converges on both hosts.
    again = _run("-c", config, "deploy", "--budget", "7", "--topk", "4")
    assert again.exit_code == 0, again.output
    _converged(project, containers, 7, 4)

    # SIGKILL (no chance to clean up) on the way back; the re-run converges too.
    rc, stderr, children = _deploy_killed(config, signal.SIGKILL, "--budget", "15", "--topk", "8")
    assert rc == -signal.SIGKILL, stderr
    # ansible-playbook loses its pty with its parent and ends on SIGHUP; a worker's running task finishes.
    _assert_ends(children, "the killed deploy's playbook is still running")
    again = _run("-c", config, "deploy", "--budget", "15", "--topk", "8")
    assert again.exit_code == 0, again.output
    _converged(project, containers, 15, 8)


# ---- a host stopped in the middle of deploy ------------------------------------------------------


SLOW_START_DIR = "/etc/systemd/system/ddtree-tree.service.d"


def _wait_for_ssh(host, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            SSH.run(host, "systemctl is-system-running --wait >/dev/null || true", timeout_s=60)
            return
        except HostError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


def _address(container: str) -> str:
    return _docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container).strip()


def test_a_host_stopped_during_its_health_gate_is_reported_and_a_rerun_after_it_returns_converges(lab):
    config, project, containers = lab
    lab1 = containers["lab-1"]
    address = _address(lab1)
    second_before = _host_files(containers["lab-2"])
    # The new release must still be starting when the host goes away: the lab engine answers /health
    # about 2 s after a restart, sooner than `docker stop` takes the host down (CI run of 2026-12-01:
    # the gate saw the tree healthy, then the baseline's /server_info refused). A drop-in beside the
    # unit deploy writes runs a sleep in the engine's place (the unit is active, /health never answers),
    # so the host is stopped mid-gate every time; once the host is back it is removed and the unit
    # restarted, which is what the host's boot does without it.
    _in_container(
        lab1,
        f"mkdir -p {SLOW_START_DIR} && printf '[Service]\\nExecStart=\\nExecStart=/bin/sleep 600\\n' "
        f"> {SLOW_START_DIR}/not-ready.conf && systemctl daemon-reload",
    )
    argv = [str(Path(sys.executable).with_name("ddtree-ops")), "-c", config, "deploy", "--budget", "7", "--topk", "4"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    gate = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("lab-1: waiting up to"):
                gate.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert gate.wait(180), "lab-1 never reached its health gate:\n" + "".join(lines)
        _docker("stop", "-t", "5", lab1)  # the new release is installed and starting: the host goes away
        stopped = time.monotonic()
        rc = proc.wait(timeout=400)
        took = time.monotonic() - stopped
        reader.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        _docker("start", lab1)
        _in_container(
            lab1,
            "systemctl is-system-running --wait >/dev/null;"  # the host's systemd is booting again
            f" rm -rf {SLOW_START_DIR} && systemctl daemon-reload && systemctl restart ddtree-tree.service",
            check=False,
        )
    stderr = "".join(lines)
    assert rc == 1, stderr
    assert "deploy failed on host 'lab-1'" in stderr
    assert "host lab-1 stopped answering (SSH and HTTP) while ddtree-tree.service was starting" in stderr, stderr
    assert "rollback of 'lab-1' FAILED too: host lab-1 (" in stderr and "unreachable over SSH" in stderr
    assert "when lab-1 answers again, its services may run the new release: run the same `ddtree-ops deploy` again" in stderr
    assert "host(s) lab-2 were not touched" in stderr
    assert took < 240, f"deploy took {took:.0f}s to give up on a stopped host: it should not wait out the 900 s gate"
    assert _host_files(containers["lab-2"]) == second_before

    # Back up (same address on the lab network), the same deploy converges, and the fleet goes back.
    assert _address(lab1) == address, "docker gave the restarted host another address: the project file no longer fits"
    _wait_for_ssh(project.host("lab-1"))
    again = _run("-c", config, "deploy", "--budget", "7", "--topk", "4")
    assert again.exit_code == 0, again.output
    _converged(project, containers, 7, 4)
    back = _run("-c", config, "deploy", "--budget", "15", "--topk", "8")
    assert back.exit_code == 0, back.output
    _converged(project, containers, 15, 8)
