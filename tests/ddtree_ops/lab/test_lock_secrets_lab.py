"""The host lock and the API key on a real lab host (systemd, sshd, Ansible, the engine), one host only.

Every command runs as its own `ddtree-ops` process, as a user runs it: two deploys at once, a deploy
killed with SIGKILL, and a planted key that is then looked for in every artefact. The module provisions
and deploys lab-1 (idempotent) and leaves it deployed with the lab's settings and no key.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from ddtree_ops.config import load_project
from ddtree_ops.hosts.layout import LOCK_PATH
from ddtree_ops.hosts.ssh import SSH

pytestmark = pytest.mark.lab

HOST = "lab-1"
DDTREE_OPS = str(Path(sys.executable).parent / "ddtree-ops")
LAB_SETTINGS = ("--budget", "15", "--topk", "8")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "DDTREE_API_KEY"}


def _ops(config: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([DDTREE_OPS, "-c", config, *args], capture_output=True, text=True, env=_env(), timeout=timeout)


class Running:
    """A `ddtree-ops` process in the background; its stderr lines are collected as they come."""

    def __init__(self, config: str, *args: str):
        self.process = subprocess.Popen([DDTREE_OPS, "-c", config, *args], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=_env())  # fmt: skip
        self.stderr: list[str] = []
        self.reader = threading.Thread(target=lambda: self.stderr.extend(self.process.stderr), daemon=True)
        self.reader.start()

    def wait_for(self, text: str, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.stderr):
            assert self.process.poll() is None, f"ended before {text!r}:\n" + "".join(self.stderr)
            assert time.monotonic() < deadline, f"no {text!r} within {timeout_s}s:\n" + "".join(self.stderr)
            time.sleep(0.2)


def _server_info(project, service: str = "tree") -> dict:
    h, s = project.host(HOST), project.service(service)
    return httpx.get(f"http://{h.address}:{s.port}/server_info", timeout=10).json()


def _lock_is_free(host) -> bool:
    return SSH.exec(host, f"flock -n {LOCK_PATH} true", timeout_s=30).returncode == 0


@pytest.fixture(scope="module")
def lab(lab_fleet):
    config = str(lab_fleet.config_path)
    provision = _ops(config, "provision", "--hosts", HOST)
    assert provision.returncode == 0, provision.stderr
    deploy = _ops(config, "deploy", "--hosts", HOST, *LAB_SETTINGS)
    assert deploy.returncode == 0, deploy.stderr
    return config, load_project(config)


def test_two_deploys_at_once_one_proceeds_and_the_other_names_the_holder(lab):
    config, project = lab
    host = project.host(HOST)
    first = Running(config, "deploy", "--hosts", HOST, "--budget", "7", "--topk", "4", "--json")
    try:
        first.wait_for(f"{HOST}: deploying")  # it holds the host's lock from before this line to its end
        second = _ops(config, "deploy", "--hosts", HOST, *LAB_SETTINGS, "--lock-timeout", "2", "--json", timeout=120)
        assert second.returncode == 1, second.stderr
        message = json.loads(second.stdout)["error"]["message"]
        assert f"host '{HOST}' is locked by another ddtree-ops run ({LOCK_PATH}): deploy by pid {first.process.pid}" in message
        assert "deploy --hosts lab-1 --budget 7 --topk 4 --json`" in message, "the holder's command line"
        assert "Waited 2s (--lock-timeout); nothing was changed by this run" in message
        assert f"root@{host.address} kill " in message, "how to clear a lock whose holder is gone"
        assert f"{HOST}: waiting up to 2s (--lock-timeout) for deploy by pid {first.process.pid}" in second.stderr
        out, _ = first.process.communicate(timeout=900)
    finally:
        if first.process.poll() is None:
            first.process.kill()
    assert first.process.returncode == 0, "".join(first.stderr)
    (deployed,) = json.loads(out)["hosts"]
    # Never interleaved: the host runs exactly what the first deploy installed, the second touched nothing.
    state = json.loads(SSH.run(host, "cat /var/lib/ddtree/state.json"))
    assert state["services"]["tree"]["current"] == {s["service"]: s for s in deployed["services"]}["tree"]["release_id"]
    assert (_server_info(project)["speculative_ddtree_budget"], _server_info(project)["speculative_ddtree_topk"]) == (7, 4)
    assert SSH.run(host, f"cat {LOCK_PATH}") == "", "a released lock names no holder"


def test_a_sigkilled_deploy_leaves_no_lock_and_a_rerun_converges(lab):
    config, project = lab
    host = project.host(HOST)
    killed = Running(config, "deploy", "--hosts", HOST, "--budget", "8", "--topk", "4")
    try:
        killed.wait_for(f"{HOST}: waiting up to")  # the playbook is done; the gate waits: mid-rollout
        assert f'"pid": {killed.process.pid}' in SSH.run(host, f"cat {LOCK_PATH}")
        os.kill(killed.process.pid, signal.SIGKILL)
        killed.process.wait(timeout=30)
    finally:
        if killed.process.poll() is None:
            killed.process.kill()
    deadline = time.monotonic() + 15
    while not _lock_is_free(host):
        assert time.monotonic() < deadline, "the killed deploy's lock is still held: " + SSH.run(host, f"cat {LOCK_PATH}")
        time.sleep(0.5)
    rerun = _ops(config, "deploy", "--hosts", HOST, *LAB_SETTINGS, "--lock-timeout", "0", "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert "locked by another" not in rerun.stderr
    info = _server_info(project)
    assert (info["speculative_ddtree_budget"], info["speculative_ddtree_topk"]) == (15, 8)


def _files_holding(host, key: str, roots: str) -> list[str]:
    # The key goes on stdin (`-f -`), never on a command line of the host.
    proc = SSH.exec(host, f"grep -rlaF -f - {roots} 2>/dev/null; true", timeout_s=300, input_text=key + "\n")
    return sorted(proc.stdout.split())


def test_a_planted_key_is_only_in_the_env_files(lab, tmp_path):
    config, project = lab
    host = project.host(HOST)
    key = f"sk-ddtree-planted-{uuid.uuid4().hex}"
    (tmp_path / "api.key").write_text(key + "\n")
    (tmp_path / "api.key").chmod(0o600)
    keyed = tmp_path / "ddtree.yaml"
    # Written elsewhere, it keeps checking host keys against the lab's known_hosts (beside the lab's file).
    lab_keys = {"known_hosts": str(Path(config).with_name("known_hosts"))}
    keyed.write_text(yaml.safe_dump({**yaml.safe_load(Path(config).read_text()), "api_key_file": "api.key", "ssh": lab_keys}))
    outputs: list[str] = []
    try:
        deploy = _ops(str(keyed), "deploy", "--hosts", HOST, *LAB_SETTINGS, "--json")
        outputs += [deploy.stdout, deploy.stderr]
        assert deploy.returncode == 0, deploy.stderr
        # The services demand it, and the tools send it (from the file, through their own environment).
        base = f"http://{host.address}:{project.service('tree').port}"
        assert httpx.get(f"{base}/v1/models", timeout=10).status_code == 401
        assert httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10).status_code == 200
        health = _ops(str(keyed), "healthcheck", "--hosts", HOST, "--json")
        outputs += [health.stdout, health.stderr]
        assert health.returncode == 0, health.stdout + health.stderr
        report = tmp_path / "report"
        compare = _ops(str(keyed), "compare", "--hosts", HOST, "--runs", "1", "--max-tokens", "16",
                       "--out", str(report), "--json")  # fmt: skip
        outputs += [compare.stdout, compare.stderr]
        assert compare.returncode == 0, compare.stdout + compare.stderr

        # On the host: only the env files (and their copies in the releases, for rollback), 0600 root.
        state = json.loads(SSH.run(host, "cat /var/lib/ddtree/state.json"))
        releases = {s: state["services"][s]["current"] for s in ("baseline", "tree")}
        allowed = {f"/etc/ddtree/{s}.env" for s in releases} | {f"/opt/ddtree/releases/{r}/{s}.env" for s, r in releases.items()}
        holding = set(_files_holding(host, key, "/etc /var /run /tmp /root /home /opt/ddtree/releases /usr/local"))
        assert holding == allowed, f"the key is in {sorted(holding - allowed)}; missing from {sorted(allowed - holding)}"
        modes = SSH.run(host, "stat -c '%a %U %G %n' " + " ".join(sorted(allowed))).splitlines()
        assert all(line.startswith("600 root root ") for line in modes), modes
        assert SSH.run(host, "stat -c '%a %U' /etc/ddtree").strip() == "700 root"
        for unit in ("ddtree-baseline.service", "ddtree-tree.service"):
            assert key not in SSH.run(host, f"systemctl cat {unit}")
        journal = SSH.exec(host, "journalctl --no-pager -o verbose | grep -cF -f -", timeout_s=120, input_text=key + "\n")
        assert journal.stdout.strip() == "0", "the key is in the journal"
        assert "ddtree-tree" in SSH.run(host, "journalctl --no-pager -u ddtree-tree.service -n 5 -o cat; echo ddtree-tree")
        processes = SSH.run(host, "ps -eo pid,args --no-headers; cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
        assert key not in processes and "ddtree-engine serve" in processes

        # Here: every output, the reports, the kept Ansible logs (and whatever else the state dir holds).
        assert not [i for i, text in enumerate(outputs) if key in text], "the key is in a command's output"
        local = [*report.rglob("*"), *Path(os.environ["DDTREE_STATE_DIR"]).rglob("*")]
        assert any(p.name.endswith(".log") for p in local), "Ansible's log is kept, so it is checked"
        assert [str(p) for p in local if p.is_file() and key.encode() in p.read_bytes()] == []
    finally:
        # Back to no key, as the lab's other tests expect (the env files change, so the services restart).
        back = _ops(config, "deploy", "--hosts", HOST, *LAB_SETTINGS)
        assert back.returncode == 0, back.stderr
    assert key not in SSH.run(host, "cat /etc/ddtree/tree.env")
