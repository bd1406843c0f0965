"""provision on real lab hosts: the env is built and verified there, and a second run changes nothing."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ddtree_ops.cli import cli
from ddtree_ops.config import load_project
from ddtree_ops.hosts.ssh import SSH

pytestmark = [pytest.mark.lab, pytest.mark.slow]



def _provision(config: str, *args: str):
    return CliRunner().invoke(cli, ["-c", config, "provision", *args], catch_exceptions=False)


def test_provision_builds_the_env_and_a_second_run_changes_nothing(lab_fleet):
    config = lab_fleet.config_path
    first = _provision(config, "--json")
    assert first.exit_code == 0, first.output
    report = json.loads(first.stdout)
    rows = {row["host"]: row for row in report["hosts"]}
    assert set(rows) == {"lab-1", "lab-2"}
    # "up to date" when another lab module provisioned first: the env is immutable either way
    assert {row["status"] for row in rows.values()} <= {"provisioned", "up to date"}

    project = load_project(config)
    for host in project.hosts:
        row = rows[host.name]
        assert row["env"] == f"/opt/ddtree/envs/{row['lock_hash'][:16]}"
        state = json.loads(SSH.run(host, "cat /var/lib/ddtree/state.json"))
        assert state["env"]["path"] == row["env"] and state["env"]["lock_hash"] == row["lock_hash"]
        # the env works on the host, from its own interpreter, and holds exactly the lock
        assert "generate" in SSH.run(host, f"{row['env']}/bin/ddtree-engine --help")
        frozen = SSH.run(host, f"{row['env']}/bin/pip freeze --all").splitlines()
        lock = report["locks"][row["lock_hash"][:16]]
        assert set(lock["requirements"]) <= {line.replace("_", "-").lower() for line in frozen} | {
            r for r in lock["requirements"] if r.startswith("ddtree-engine==")
        }
        assert "ddtree-engine==0.1.0" in {line.lower().replace("_", "-") for line in frozen}

    second = _provision(config)
    assert second.exit_code == 0, second.output
    for host in project.hosts:
        assert f"{host.name}: up to date (env {rows[host.name]['lock_hash'][:16]})" in second.stdout
    again = json.loads(_provision(config, "--json").stdout)
    assert [row["changed"] for row in again["hosts"]] == [0, 0]


def test_provision_of_one_named_host_touches_only_that_host(lab_fleet):
    result = _provision(lab_fleet.config_path, "lab-2", "--json")
    assert result.exit_code == 0, result.output
    assert [row["host"] for row in json.loads(result.stdout)["hosts"]] == ["lab-2"]
