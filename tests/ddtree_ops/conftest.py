"""Fixtures shared by the ddtree_ops tests.

- every test gets its own ddtree-ops state directory (Ansible logs) under tmp_path;
- `lab_fleet` (session): `lab up --hosts 2` once in a temporary lab directory, `lab down` at the end.
  Without Docker it skips, unless $DDTREE_REQUIRE_LAB is set (CI), where it fails.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

REQUIRE_LAB_ENV = "DDTREE_REQUIRE_LAB"


@pytest.fixture(autouse=True)
def _ddtree_state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DDTREE_STATE_DIR", str(tmp_path / "ddtree-state"))


def _docker_or_skip() -> None:
    from ddtree_ops.lab.docker import DockerUnavailable, ensure_docker

    try:
        ensure_docker()
    except DockerUnavailable as err:
        if os.environ.get(REQUIRE_LAB_ENV):
            pytest.fail(f"${REQUIRE_LAB_ENV} is set but Docker is not available: {err}")
        pytest.skip(f"lab tests need Docker: {err}")


@pytest.fixture(scope="session")
def docker_available() -> None:
    """Docker runs here (it is started when it can be); else the test skips, or fails under $DDTREE_REQUIRE_LAB."""
    _docker_or_skip()


@pytest.fixture(scope="session")
def lab_fleet(tmp_path_factory):
    """Two lab hosts (lab-1, lab-2) and their ddtree.yaml; yields the `LabReport` of `lab up`.

    `report.config_path` is the lab's project file; `report.lab_dir` holds its SSH key.
    """
    from ddtree_ops import lab

    _docker_or_skip()
    lab_dir = tmp_path_factory.mktemp("lab") / "lab"
    report = lab.up(2, lab_dir)
    yield report
    lab.down(lab_dir)
    # `down` removes everything `up` made: none of this lab's containers, its network, its directory.
    leftover = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label=ddtree.lab.id={report.lab_id}", "--format", "{{.Names}}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    network = subprocess.run(["docker", "network", "inspect", report.network], capture_output=True, check=False)
    assert leftover == [] and network.returncode != 0 and not lab_dir.exists(), json.dumps(
        {"containers": leftover, "network_left": network.returncode == 0, "dir_left": lab_dir.exists()}
    )
