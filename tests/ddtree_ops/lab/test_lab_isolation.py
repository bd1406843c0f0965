"""One lab per directory: two labs on one Docker daemon come up, answer and go down independently.

Each lab here has one host (quick). Also: `up` refuses a container that has one of its names but
another lab's labels, and old-style objects (the global `ddtree-lab-N` names of before) are named
in a warning and left alone by `up`, `status` and `down`.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddtree_ops import lab
from ddtree_ops.cli import cli
from ddtree_ops.lab.fleet import ssh_answers
from ddtree_ops.lab.identity import LAB_DIR_ENV, LABEL, LABEL_DIR, LABEL_ID
from ddtree_ops.lab.image import LAB_IMAGE, ensure_image

pytestmark = pytest.mark.lab


def _invoke(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)


def _container_id(name: str) -> str | None:
    proc = _docker("inspect", "--format", "{{.Id}}", name, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


def _subnet(network: str) -> str:
    return json.loads(_docker("network", "inspect", network).stdout)[0]["IPAM"]["Config"][0]["Subnet"]


def _status(lab_dir: Path) -> dict:
    result = _invoke("lab", "status", "--dir", lab_dir, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def old_style_container(lab_fleet_docker):
    """A container like the ones labs made before they were per directory (global name, bare label)."""
    name = f"ddtree-lab-{secrets.randbelow(9000) + 1000}"
    _docker("create", "--name", name, "--label", LABEL, LAB_IMAGE)  # created, never started
    yield name
    _docker("rm", "-f", name, check=False)


@pytest.fixture(scope="module")
def lab_fleet_docker():
    from ddtree_ops.lab.docker import DockerUnavailable, ensure_docker

    try:
        ensure_docker()
    except DockerUnavailable as err:
        pytest.skip(f"lab tests need Docker: {err}")
    ensure_image()


@pytest.fixture
def two_lab_dirs(tmp_path):
    dirs = (tmp_path / "alpha" / "lab", tmp_path / "beta" / "lab")
    yield dirs
    for lab_dir in dirs:  # a failed assertion must not leave a lab behind
        lab.down(lab_dir)


def test_two_labs_up_and_down_independently(two_lab_dirs, old_style_container, monkeypatch):
    dir_a, dir_b = two_lab_dirs
    up_a = _invoke("lab", "up", "--hosts", "1", "--dir", dir_a, "--json")
    assert up_a.exit_code == 0, up_a.output
    a = json.loads(up_a.stdout)
    up_b = _invoke("lab", "up", "--hosts", "1", "--dir", dir_b, "--json")
    assert up_b.exit_code == 0, up_b.output
    b = json.loads(up_b.stdout)

    # Own names, own networks on different subnets, own keys.
    assert a["lab_id"] != b["lab_id"]
    (host_a,), (host_b,) = a["hosts"], b["hosts"]
    assert (host_a["name"], host_b["name"]) == ("lab-1", "lab-1")  # the project files' names stay lab-N
    assert (host_a["container"], host_b["container"]) == (f"ddtree-lab-{a['lab_id']}-1", f"ddtree-lab-{b['lab_id']}-1")
    assert _subnet(a["network"]) != _subnet(b["network"]) and host_a["address"] != host_b["address"]
    key_a, key_b = Path(a["lab_dir"]) / "id_ed25519", Path(b["lab_dir"]) / "id_ed25519"
    assert ssh_answers(host_a["address"], key_a) and ssh_answers(host_b["address"], key_b)
    # `up` B did not re-key A's host (and A's key opens only A's: each checked against the other host's
    # recorded host key, so it is the login key that is refused, not the host)
    known_a, known_b = key_a.parent / "known_hosts", key_b.parent / "known_hosts"
    assert not ssh_answers(host_b["address"], key_a, known_hosts=known_b)
    assert not ssh_answers(host_a["address"], key_b, known_hosts=known_a)

    # The old-style container is named, with how to remove it, and left alone.
    removal = re.compile(rf"remove them with: docker rm -f [^&]*\b{old_style_container}\b")
    assert any(removal.search(w) for w in b["warnings"]), b["warnings"]
    assert _container_id(old_style_container) is not None

    # Re-running `up` in A (now the default lab dir, no --dir) neither removes nor re-keys B's host ...
    id_b = _container_id(host_b["container"])
    monkeypatch.setenv(LAB_DIR_ENV, str(dir_a))
    monkeypatch.delenv("DDTREE_CONFIG", raising=False)
    monkeypatch.chdir(dir_a.parent)  # no ./ddtree.yaml here
    again = _invoke("lab", "up", "--hosts", "1")
    assert again.exit_code == 0, again.output
    assert "next:         ddtree-ops provision" in again.stdout
    assert _container_id(host_b["container"]) == id_b and ssh_answers(host_b["address"], key_b)
    # ... and a plain command finds A's project file and probes A's host over SSH.
    plan = _invoke("provision", "--plan", "--json")
    assert plan.exit_code == 0, plan.output
    assert f"using the lab's project file {a['config_path']}" in plan.stderr
    planned = [(h["host"], h["ok"], h["facts_source"]) for h in json.loads(plan.stdout)["hosts"]]
    assert planned == [("lab-1", True, "probe over SSH")]

    # Each status lists its own host only and names the other lab by directory.
    status_a, status_b = _status(dir_a), _status(dir_b)
    assert [h["container"] for h in status_a["hosts"]] == [host_a["container"]] and status_a["hosts"][0]["ssh"]
    assert [h["container"] for h in status_b["hosts"]] == [host_b["container"]] and status_b["hosts"][0]["ssh"]
    assert b["lab_dir"] in status_a["other_labs"] and a["lab_dir"] in status_b["other_labs"]

    # `down` B removes B's container, volume, network and directory; A keeps running and answering.
    id_a = _container_id(host_a["container"])
    down_b = _invoke("lab", "down", "--dir", dir_b, "--json")
    assert down_b.exit_code == 0, down_b.output
    removed = json.loads(down_b.stdout)["removed"]
    assert host_b["container"] in removed and f"network {b['network']}" in removed and not dir_b.exists()
    assert _container_id(host_b["container"]) is None and _docker("network", "inspect", b["network"], check=False).returncode
    assert _container_id(host_a["container"]) == id_a and ssh_answers(host_a["address"], key_a)
    status_a = _status(dir_a)
    assert [(h["container"], h["ssh"]) for h in status_a["hosts"]] == [(host_a["container"], True)]

    # B's directory now has no lab: status says so and shows none of A's hosts.
    empty = _invoke("lab", "status", "--dir", dir_b)
    assert empty.exit_code == 0 and f"no lab in {b['lab_dir']}" in empty.stdout
    assert host_a["container"] not in empty.stdout and a["lab_dir"] in empty.stdout  # named as another lab

    down_a = _invoke("lab", "down", "--dir", dir_a, "--json")
    assert down_a.exit_code == 0 and host_a["container"] in json.loads(down_a.stdout)["removed"]
    assert _container_id(host_a["container"]) is None
    assert _container_id(old_style_container) is not None  # `down` left the old-style container alone


def test_up_refuses_a_name_held_by_another_labs_container(tmp_path, old_style_container):
    lab_dir = tmp_path / "gamma" / "lab"
    mine = lab.Lab.at(lab_dir)
    squatter = mine.container(1)
    _docker(
        "create", "--name", squatter, "--label", LABEL, "--label", f"{LABEL_ID}=other-0000abcd",
        "--label", f"{LABEL_DIR}=/somewhere/else", LAB_IMAGE,
    )  # fmt: skip
    try:
        before = _container_id(squatter)
        result = _invoke("lab", "up", "--hosts", "1", "--dir", lab_dir)
        assert result.exit_code == 1
        assert f"the container {squatter} belongs to the lab in /somewhere/else (id other-0000abcd)" in result.stderr
        assert f"`docker rm -f {squatter}`" in result.stderr
        # nothing was touched: the container is the same one, no network or directory was made
        assert _container_id(squatter) == before
        assert _docker("network", "inspect", mine.network, check=False).returncode != 0
        assert not lab_dir.exists()

        # status and down of this (empty) lab see neither the squatter nor the old-style container as theirs
        status = _status(lab_dir)
        assert status["hosts"] == [] and "/somewhere/else" in status["other_labs"]
        down = _invoke("lab", "down", "--dir", lab_dir, "--json")
        assert down.exit_code == 0 and json.loads(down.stdout)["removed"] == []
        assert _container_id(squatter) == before and _container_id(old_style_container) is not None
    finally:
        _docker("rm", "-f", squatter, check=False)
