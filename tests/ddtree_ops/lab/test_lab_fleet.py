"""`lab up | status` against real containers (systemd as PID 1, sshd); `down` is checked by the fixture."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddtree_ops.cli import cli
from ddtree_ops.config import load_project
from ddtree_ops.lab.fleet import ssh_answers
from ddtree_ops.lab.identity import lab_id

pytestmark = pytest.mark.lab


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _container_ids(lab_id: str) -> dict[str, str]:
    out = subprocess.run(
        ["docker", "ps", "--filter", f"label=ddtree.lab.id={lab_id}", "--format", "{{.Names}} {{.ID}}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return dict(line.split() for line in out.splitlines())


def test_status_shows_booted_hosts_reachable_over_ssh(lab_fleet):
    result = _invoke("lab", "status", "--dir", lab_fleet.lab_dir, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [h["name"] for h in report["hosts"]] == ["lab-1", "lab-2"]
    # containers and network are named after this lab's directory, not shared by every lab
    assert report["lab_id"] == lab_id(lab_fleet.lab_dir)
    assert [h["container"] for h in report["hosts"]] == [f"ddtree-lab-{report['lab_id']}-{i}" for i in (1, 2)]
    assert report["network"] == f"ddtree-lab-{report['lab_id']}"
    for host in report["hosts"]:
        assert host["state"] == "running"
        assert host["systemd"] == "running", host  # every unit came up: nothing failed in the container
        assert host["ssh"] is True
    assert len({h["address"] for h in report["hosts"]}) == 2


def test_the_lab_project_file_validates_and_reaches_the_hosts(lab_fleet):
    project = load_project(lab_fleet.config_path)
    assert [h.name for h in project.hosts] == ["lab-1", "lab-2"]
    assert project.engine.backend == "reference" and project.engine.device == "cpu"
    assert (project.service("baseline").algorithm, project.service("baseline").port) == ("dflash", 30000)
    tree = project.service("tree")
    assert (tree.algorithm, tree.budget, tree.topk, tree.port) == ("ddtree", 15, 8, 30001)
    for host in project.hosts:
        # this machine reaches each container by its bridge IP, with the lab's own key
        assert ssh_answers(host.address, Path(host.ssh.key)), host


def test_up_again_reuses_the_running_hosts(lab_fleet):
    before = _container_ids(lab_fleet.lab_id)
    result = _invoke("lab", "up", "--hosts", "2", "--dir", lab_fleet.lab_dir)
    assert result.exit_code == 0, result.output
    assert f"export DDTREE_CONFIG={lab_fleet.config_path}" in result.output
    assert _container_ids(lab_fleet.lab_id) == before
    assert [h.address for h in load_project(lab_fleet.config_path).hosts] == [h.address for h in lab_fleet.hosts]


def test_systemd_is_pid_1_and_sshd_runs_under_it(lab_fleet):
    for host in lab_fleet.hosts:
        out = subprocess.run(
            ["docker", "exec", host.container, "sh", "-c", "cat /proc/1/comm; systemctl is-active ssh"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        assert out == ["systemd", "active"]


def test_lab_engines_get_one_torch_thread_each(lab_fleet):
    # Every lab host shares this machine's cores (fleet.LAB_THREADS_ENV): set for every unit systemd starts,
    # now (manager environment) and after a reboot of the container (the drop-in), not in deploy's units.
    for host in lab_fleet.hosts:
        out = subprocess.run(
            ["docker", "exec", host.container, "sh", "-c",
             "systemctl show-environment; cat /etc/systemd/system.conf.d/ddtree-lab-threads.conf"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        assert "OMP_NUM_THREADS=1" in out and "DefaultEnvironment=OMP_NUM_THREADS=1" in out, out
