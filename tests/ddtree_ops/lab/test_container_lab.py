"""Container mode on a real lab host: provision builds the CPU-flavour engine image here from the
lock's wheelhouse, starts lab-2's own Docker Engine, streams the image there (`docker save | ssh
docker load`) and verifies it on the host; deploy runs the services from it under systemd.

The services (c-base, c-tree on ports 30100/30101, lab-2 only) are this module's own, so the
venv-mode services other modules deploy on the same hosts are not disturbed; they are undeployed
at the end.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import yaml
from click.testing import CliRunner

from ddtree_ops.cli import cli
from ddtree_ops.config import load_project
from ddtree_ops.hosts.ssh import SSH

pytestmark = [pytest.mark.lab, pytest.mark.slow]

SERVICES = [
    {"name": "c-base", "algorithm": "dflash", "port": 30100, "hosts": ["lab-2"]},
    {"name": "c-tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "port": 30101, "hosts": ["lab-2"]},
]


def _run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def container_config(lab_fleet, tmp_path_factory):
    doc = yaml.safe_load(open(lab_fleet.config_path))
    doc["engine"]["install"] = {"mode": "container"}
    doc["services"] = SERVICES
    # Written elsewhere, it keeps checking host keys against the lab's known_hosts (beside the lab's file).
    doc["ssh"] = {**doc.get("ssh", {}), "known_hosts": str(Path(lab_fleet.config_path).with_name("known_hosts"))}
    path = tmp_path_factory.mktemp("container") / "ddtree.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    yield str(path)
    removed = _run("-c", str(path), "undeploy", "--all")
    assert removed.exit_code == 0, removed.output


def _local_image_id(tag: str) -> str:
    import subprocess

    return subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True, text=True, check=True
    ).stdout.strip()


def _wait_healthy(url: str, timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} not healthy within {timeout_s}s")


def test_provision_builds_ships_and_verifies_the_image_then_is_idempotent(container_config):
    project = load_project(container_config)
    lab1, lab2 = project.host("lab-1"), project.host("lab-2")

    first = _run("-c", container_config, "provision", "lab-2", "--json")
    assert first.exit_code == 0, first.output
    (row,) = json.loads(first.stdout)["hosts"]
    lock_hash = row["lock_hash"]
    tag = f"ddtree-engine:{lock_hash[:16]}"
    assert row["image"] == tag and row["manifest"] == "ok" and row["python"] == "cp311"
    assert row["env"] == f"/opt/ddtree/images/{lock_hash[:16]}"

    # The host's Docker Engine runs now, holds the very image built here, and the record is in state.json.
    assert SSH.run(lab2, "systemctl is-active docker; systemctl is-enabled docker").split() == ["active", "enabled"]
    remote_id = SSH.run(lab2, f"docker image inspect --format '{{{{.Id}}}}' {tag}").strip()
    assert remote_id == _local_image_id(tag)
    state = json.loads(SSH.run(lab2, "cat /var/lib/ddtree/state.json"))
    assert state["image"]["tag"] == tag and state["image"]["lock_hash"] == lock_hash
    stored = json.loads(SSH.run(lab2, f"cat {row['env']}/abi-manifest.json"))
    assert stored["ok"] is True
    assert {c["name"]: c["status"] for c in stored["checks"]}["import:ddtree_engine.reference.engine"] == "ok"
    # lab-1 was not asked for: its Docker Engine stays off.
    assert SSH.run(lab1, "systemctl is-active docker || true").strip() == "inactive"

    # doctor sees the same: Docker running, the lock's image loaded, its stored manifest passing; lab-1 has no engine running.
    doctor = _run("-c", container_config, "doctor", "--json")
    checks = {(c["scope"], c["name"]): c for c in json.loads(doctor.stdout)["checks"]}
    assert [checks[("lab-2", n)]["status"] for n in ("docker", "image", "manifest")] == ["ok", "ok", "ok"], doctor.stdout
    assert tag in checks[("lab-2", "image")]["detail"] and checks[("control", "docker")]["status"] == "ok"
    assert checks[("lab-1", "docker")]["status"] == "fail" and "not running" in checks[("lab-1", "docker")]["detail"]
    assert doctor.exit_code == 1

    second = _run("-c", container_config, "provision", "lab-2", "--json")
    assert second.exit_code == 0, second.output
    (again,) = json.loads(second.stdout)["hosts"]
    assert again["changed"] == 0 and again["status"] == "up to date", again


def test_deploy_runs_the_services_from_the_image_under_systemd(container_config):
    project = load_project(container_config)
    lab2 = project.host("lab-2")
    state = json.loads(SSH.run(lab2, "cat /var/lib/ddtree/state.json"))
    tag = state["image"]["tag"]

    deployed = _run("-c", container_config, "deploy", "--budget", "15", "--topk", "8", "--json")
    assert deployed.exit_code == 0, deployed.output
    rows = {s["service"]: s for h in json.loads(deployed.stdout)["hosts"] for s in h["services"]}
    assert {name: r["status"] for name, r in rows.items()} == {"c-base": "healthy", "c-tree": "healthy"}

    exec_start = SSH.run(lab2, "systemctl show -p ExecStart --value ddtree-c-tree.service")
    assert "/usr/bin/docker" in exec_start and tag in exec_start
    running = SSH.run(lab2, "docker ps --format '{{.Names}} {{.Image}}'").split("\n")
    assert f"ddtree-c-tree {tag}" in running and f"ddtree-c-base {tag}" in running

    url = f"http://{lab2.address}:30101"
    info = httpx.get(f"{url}/server_info", timeout=10).json()
    assert (info["speculative_algorithm"], info["speculative_ddtree_budget"], info["speculative_ddtree_topk"]) == ("DDTREE", 15, 8)
    reply = httpx.post(
        f"{url}/v1/completions", json={"model": "lab", "prompt": "def add(a, b):", "max_tokens": 12, "temperature": 0}, timeout=120
    )
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1

    # The service's cache directory (CacheDirectory=) is mounted at its own path: what one container leaves in
    # TRITON_CACHE_DIR the next one, started after a crash, finds (`--rm` drops everything else).
    cache = SSH.run(lab2, "docker exec ddtree-c-tree sh -c 'mkdir -p \"$TRITON_CACHE_DIR\" && "
                          "touch \"$TRITON_CACHE_DIR/left-by-the-last-run\" && echo \"$TRITON_CACHE_DIR\"'").strip()
    assert cache == "/var/cache/ddtree/c-tree/triton"

    # systemd supervises the container: killed, it comes back through Restart=on-failure.
    main_pid = SSH.run(lab2, "systemctl show -p MainPID --value ddtree-c-tree.service").strip()
    SSH.run(lab2, "docker kill ddtree-c-tree")
    _wait_healthy(url, timeout_s=120)
    assert "left-by-the-last-run" in SSH.run(lab2, f"docker exec ddtree-c-tree ls {cache}").split()
    assert SSH.run(lab2, f"stat -c %F {cache}/left-by-the-last-run").strip() == "regular empty file"
    assert SSH.run(lab2, "systemctl show -p MainPID --value ddtree-c-tree.service").strip() != main_pid
    assert int(SSH.run(lab2, "systemctl show -p NRestarts --value ddtree-c-tree.service")) >= 1

    health = _run("-c", container_config, "healthcheck", "--json")
    assert health.exit_code == 0, health.output

    again = _run("-c", container_config, "deploy", "--json")
    assert again.exit_code == 0, again.output
    assert [h["changed"] for h in json.loads(again.stdout)["hosts"]] == [0], "a second identical deploy changes nothing"


def test_undeploy_stops_the_containers_and_forgets_the_services(container_config):
    project = load_project(container_config)
    lab2 = project.host("lab-2")
    removed = _run("-c", container_config, "undeploy", "--all", "--json")
    assert removed.exit_code == 0, removed.output
    assert SSH.run(lab2, "docker ps --format '{{.Names}}'").split() == []
    state = json.loads(SSH.run(lab2, "cat /var/lib/ddtree/state.json"))
    assert not set(state.get("services") or {}) & {"c-base", "c-tree"}
    assert SSH.run(lab2, "ls /etc/systemd/system/ddtree-c-tree.service 2>/dev/null || echo gone").strip() == "gone"
    # Stopping a container is a clean stop, and the killed-and-restarted unit left no failed state behind.
    assert SSH.run(lab2, "systemctl list-units --failed --plain --no-legend 'ddtree-*'").strip() == ""
