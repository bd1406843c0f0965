"""deploy and rollback on the lab fleet: real hosts (systemd, sshd), real Ansible, the real engine.

Needs the `lab_fleet` fixture (tests/ddtree_ops/conftest.py). Provision and the first deploy are
idempotent, so this module can run before or after the other lab modules; it leaves the fleet
deployed with the lab's own settings (budget 15, topk 8).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml
from click.testing import CliRunner

from ddtree_ops.cli import cli
from ddtree_ops.config import load_project
from ddtree_ops.hosts.ssh import SSH
from ddtree_ops.deploy.units import render_env_file, render_unit, unit_spec

pytestmark = pytest.mark.lab

IMPOSSIBLE_MODEL = "/nonexistent/ddtree-model"


def _run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _state(project, host: str) -> dict:
    return json.loads(SSH.run(project.host(host), "cat /var/lib/ddtree/state.json"))


def _server_info(project, host: str, service: str) -> dict:
    h, s = project.host(host), project.service(service)
    assert httpx.get(f"http://{h.address}:{s.port}/health", timeout=10).status_code == 200
    return httpx.get(f"http://{h.address}:{s.port}/server_info", timeout=10).json()


@pytest.fixture(scope="module")
def lab(lab_fleet):
    config = str(lab_fleet.config_path)
    provision = _run("-c", config, "provision")
    assert provision.exit_code == 0, provision.output
    project = load_project(config)
    assert len(project.hosts) >= 2, "the deploy lab tests need two lab hosts"
    return config, project


@pytest.fixture(scope="module")
def deployed(lab):
    config, project = lab
    result = _run("-c", config, "deploy", "--budget", "15", "--topk", "8", "--json")
    assert result.exit_code == 0, result.output
    return config, project, json.loads(result.stdout)


def test_deploy_makes_every_service_healthy(deployed):
    _config, project, report = deployed
    assert report["ok"] is True
    assert [h["host"] for h in report["hosts"]] == [h.name for h in project.hosts]
    for host in report["hosts"]:
        assert host["status"] == "deployed"
        assert {s["service"]: s["status"] for s in host["services"]} == {s.name: "healthy" for s in project.services}
        for service in host["services"]:
            assert service["release_id"] and service["healthy_after_s"] is not None
        info = _server_info(project, host["host"], "tree")
        assert info["speculative_algorithm"] == "DDTREE"
        assert (info["speculative_ddtree_budget"], info["speculative_ddtree_topk"]) == (15, 8)


def test_host_files_are_the_templates_rendered_by_ansible(deployed):
    _config, project, _report = deployed
    host = project.hosts[0]
    state = _state(project, host.name)
    assert state["env"]["path"].startswith("/opt/ddtree/envs/"), "provision's keys must survive a deploy"
    service = project.service("tree")
    spec = unit_spec(service, host, project.engine, metrics_log_interval=project.deploy.metrics_log_interval)
    release = state["services"]["tree"]["current"]
    assert SSH.run(host, "cat /etc/systemd/system/ddtree-tree.service") == render_unit(spec, state["env"]["path"])
    assert SSH.run(host, f"cat /opt/ddtree/releases/{release}/ddtree-tree.service") == render_unit(
        spec, state["env"]["path"]
    )
    assert SSH.run(host, "cat /etc/ddtree/tree.env") == render_env_file(spec)
    assert SSH.run(host, "stat -c %a /etc/ddtree/tree.env").strip() == "600"
    assert json.loads(SSH.run(host, f"cat /opt/ddtree/releases/{release}/release.json"))["release_id"] == release


def test_second_identical_deploy_changes_nothing(deployed):
    config, project, first = deployed
    result = _run("-c", config, "deploy", "--budget", "15", "--topk", "8", "--json")
    assert result.exit_code == 0, result.output
    second = json.loads(result.stdout)
    assert [h["changed"] for h in second["hosts"]] == [0] * len(project.hosts)
    releases = lambda r: {(h["host"], s["service"]): s["release_id"] for h in r["hosts"] for s in h["services"]}
    assert releases(second) == releases(first)
    # Said so, with the settings that are deployed, not "installing" and "healthy after 0.0s".
    assert second["command"] == "deploy" and second["changed"] is False and second["failures"] == []
    assert {s["status"] for h in second["hosts"] for s in h["services"]} == {"unchanged"}
    assert "up to date, nothing changed" in result.stderr and "installing" not in result.stderr
    assert "healthy after" not in result.stderr
    assert "tree (ddtree budget 15, topk 8, block 16)" in result.stderr


def test_unhealthy_deploy_rolls_back_the_first_host_and_leaves_the_second_untouched(deployed, tmp_path):
    config, project, _report = deployed
    first, second = project.hosts[0].name, project.hosts[1].name
    state_first_before = _state(project, first)
    state_second_before = SSH.run(project.hosts[1], "cat /var/lib/ddtree/state.json")
    unit_second_before = SSH.run(project.hosts[1], "cat /etc/systemd/system/ddtree-tree.service")

    document = yaml.safe_load(Path(config).read_text())
    document["engine"]["target"] = IMPOSSIBLE_MODEL
    document["deploy"] = {**document.get("deploy", {}), "health_timeout_s": 25, "health_interval_s": 1}
    # Written elsewhere, it keeps checking host keys against the lab's known_hosts (beside the lab's file).
    document["ssh"] = {**document.get("ssh", {}), "known_hosts": str(Path(config).with_name("known_hosts"))}
    bad_config = tmp_path / "ddtree.yaml"
    bad_config.write_text(yaml.safe_dump(document))

    result = _run("-c", str(bad_config), "deploy", "--services", "tree", "--budget", "7", "--topk", "4", "--json")
    assert result.exit_code == 1, result.output
    assert f"deploy failed on host {first!r}" in result.stderr
    assert "service 'tree'" in result.stderr
    assert IMPOSSIBLE_MODEL in result.stderr, "the journal tail should show why the engine did not start"
    assert f"{second} were not touched" in result.stderr
    report = json.loads(result.stdout)
    assert [h["status"] for h in report["hosts"]] == ["rolled back", "skipped"]

    # The first host runs its previous release again, with the old settings.
    info = _server_info(project, first, "tree")
    assert (info["speculative_ddtree_budget"], info["speculative_ddtree_topk"]) == (15, 8)
    state_first_after = _state(project, first)
    assert state_first_after["services"]["tree"]["current"] == state_first_before["services"]["tree"]["current"]
    assert state_first_after["services"]["baseline"] == state_first_before["services"]["baseline"]
    assert state_first_after["env"] == state_first_before["env"]
    _server_info(project, first, "baseline")

    # The second host was never reached.
    assert SSH.run(project.hosts[1], "cat /var/lib/ddtree/state.json") == state_second_before
    assert SSH.run(project.hosts[1], "cat /etc/systemd/system/ddtree-tree.service") == unit_second_before


def test_rollback_command_restores_the_previous_release(deployed):
    config, project, _report = deployed
    first = project.hosts[0].name
    result = _run("-c", config, "deploy", "--hosts", first, "--services", "tree", "--budget", "7", "--topk", "4")
    assert result.exit_code == 0, result.output
    assert _server_info(project, first, "tree")["speculative_ddtree_budget"] == 7

    result = _run("-c", config, "rollback", "--hosts", first, "--services", "tree", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (host,) = doc["hosts"]
    assert host["status"] == "rolled back" and host["services"][0]["healthy_after_s"] is not None
    assert host["services"][0]["release_changed"] is True and doc["changed"] is True
    info = _server_info(project, first, "tree")
    assert (info["speculative_ddtree_budget"], info["speculative_ddtree_topk"]) == (15, 8)

    # The rollback used up the previous release: a second one has nothing to go back to, and says so.
    again = _run("-c", config, "rollback", "--hosts", first, "--services", "tree")
    assert again.exit_code == 1, again.output
    assert f"nothing to roll back: tree on {first} has no previous release" in again.stderr


def _process_env(host, unit: str) -> dict[str, str]:
    pid = SSH.run(host, f"systemctl show -p MainPID --value {unit}").strip()
    raw = SSH.run(host, f"tr '\\0' '\\n' < /proc/{pid}/environ")
    return dict(line.split("=", 1) for line in raw.splitlines() if "=" in line)


def test_a_services_env_reaches_its_process_and_a_deploy_without_it_takes_it_away(deployed, tmp_path):
    config, project, _report = deployed
    host = project.hosts[0]
    document = yaml.safe_load(Path(config).read_text())
    tree = next(s for s in document["services"] if s["name"] == "tree")
    # An engine switch (YAML reads `reference` as text; the reference backend reads it) and a value
    # systemd must not expand or unquote.
    tree["env"] = {"DDTREE_KERNELS": "reference", "LAB_NOTE": 'a "quoted" $HOME %n value\\'}
    document["ssh"] = {**document.get("ssh", {}), "known_hosts": str(Path(config).with_name("known_hosts"))}
    with_env = tmp_path / "ddtree.yaml"
    with_env.write_text(yaml.safe_dump(document))

    result = _run("-c", str(with_env), "deploy", "--hosts", host.name, "--services", "tree", "--budget", "15", "--topk", "8", "--json")
    assert result.exit_code == 0, result.output
    (report,) = json.loads(result.stdout)["hosts"]
    assert report["services"][0]["release_changed"] is True
    env = _process_env(host, "ddtree-tree.service")
    assert env["DDTREE_KERNELS"] == "reference"
    assert env["LAB_NOTE"] == 'a "quoted" $HOME %n value\\'
    assert env["DDTREE_SERVICE"] == "tree" and env["HF_HUB_OFFLINE"] == "1"
    # Compiled kernels go to the unit's CacheDirectory=, which systemd made and keeps across restarts.
    assert env["TRITON_CACHE_DIR"] == "/var/cache/ddtree/tree/triton"
    assert SSH.run(host, "stat -c %F /var/cache/ddtree/tree").strip() == "directory"
    assert "DDTREE_KERNELS" not in _process_env(host, "ddtree-baseline.service")

    result = _run("-c", config, "deploy", "--hosts", host.name, "--services", "tree", "--budget", "15", "--topk", "8")
    assert result.exit_code == 0, result.output
    env = _process_env(host, "ddtree-tree.service")
    assert "DDTREE_KERNELS" not in env and "LAB_NOTE" not in env


def test_undeploy_asks_then_removes_then_has_nothing_to_remove(deployed):
    # Last in this module: it removes the services the others use.
    config, project, _report = deployed
    last = project.hosts[-1].name
    refused = _run("-c", config, "undeploy")  # CliRunner's stdin is no terminal, and no --yes/--all
    assert refused.exit_code == 2 and "Pass --all (or --yes)" in refused.output
    assert SSH.run(project.hosts[-1], "systemctl is-active ddtree-tree.service").strip() == "active"

    removed = _run("-c", config, "undeploy", "--hosts", last, "--services", "tree", "--json")
    assert removed.exit_code == 0, removed.output
    (host,) = json.loads(removed.stdout)["hosts"]
    assert host["status"] == "removed" and host["services"] == [{"service": "tree", "status": "absent"}]

    again = _run("-c", config, "undeploy", "--hosts", last, "--services", "tree")
    assert again.exit_code == 0, again.output
    assert f"{last}: nothing to remove (tree not deployed there)" in again.stdout

    rollback = _run("-c", config, "rollback", "--hosts", last, "--services", "tree")
    assert rollback.exit_code == 1 and f"nothing to roll back: tree on {last} is not deployed" in rollback.stderr
