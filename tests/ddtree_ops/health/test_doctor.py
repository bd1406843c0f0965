"""`doctor`: control-node checks on real files and tools, hosts that do not answer, and the lab fleet."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ddtree_ops.health import doctor
from ddtree_ops.cli import cli
from ddtree_ops.config import Project


def write_project(tmp_path: Path, hosts: list[dict], mode: str = "venv") -> Path:
    path = tmp_path / "ddtree.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "hosts": hosts,
                "engine": {"backend": "reference", "target": "lab", "draft": "lab", "install": {"mode": mode}},
                "services": [{"name": "baseline", "algorithm": "dflash", "port": 30000}],
            }
        )
    )
    return path


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_host_on_a_closed_port_is_unreachable_and_exits_1(tmp_path):
    config = write_project(tmp_path, [{"name": "closed", "address": "127.0.0.1", "ssh": {"port": 9}}])
    result = invoke("-c", str(config), "doctor", "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    rows = {(c["scope"], c["name"]): c for c in doc["checks"]}
    assert rows[("closed", "reachable")]["status"] == "fail"
    assert "unreachable over SSH (root@127.0.0.1:9)" in rows[("closed", "reachable")]["detail"]
    assert {rows[("closed", n)]["status"] for n in ("probe", "lock", "manifest", "drift")} == {"skip"}
    assert rows[("control", "ansible-runner")]["status"] == "ok"


def test_host_that_does_not_answer_times_out_quickly(tmp_path):
    # 192.0.2.0/24 is TEST-NET-1: packets go nowhere, so only the connect timeout ends the attempt.
    config = write_project(tmp_path, [{"name": "silent", "address": "192.0.2.10"}])
    result = invoke("-c", str(config), "doctor", "--connect-timeout", "2")
    assert result.exit_code == 1
    line = next(l for l in result.stdout.splitlines() if " silent " in l and "reachable" in l)
    assert line.startswith("FAIL") and "unreachable over SSH (root@192.0.2.10:22)" in line


def test_unknown_host_is_a_usage_error(tmp_path):
    config = write_project(tmp_path, [{"name": "a", "address": "127.0.0.1"}])
    result = invoke("-c", str(config), "doctor", "nosuch")
    assert result.exit_code == 2 and "unknown host 'nosuch'" in result.stderr


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")
def test_ssh_key_checks_on_real_keys(tmp_path):
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    assert doctor.ssh_key_check(str(key)).status == "ok"
    key.chmod(0o644)
    check = doctor.ssh_key_check(str(key))
    assert check.status == "fail" and "chmod 600" in check.detail
    missing = doctor.ssh_key_check(str(tmp_path / "nope"))
    assert missing.status == "fail" and "does not exist" in missing.detail


def test_public_key_given_as_private_key(tmp_path):
    pub = tmp_path / "id.pub"
    pub.write_text("ssh-ed25519 AAAAC3Nza... user@host\n")
    pub.chmod(0o600)
    check = doctor.ssh_key_check(str(pub))
    assert check.status == "fail" and "is it the .pub file?" in check.detail


def test_control_checks_name_the_key_of_the_project(tmp_path):
    key = tmp_path / "lab_key"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nxx\n-----END OPENSSH PRIVATE KEY-----\n")
    key.chmod(0o600)
    project = Project.model_validate(yaml.safe_load(write_project(tmp_path, [{"name": "a", "address": "127.0.0.1", "ssh": {"key": str(key)}}]).read_text()))
    rows = {c.name: c for c in doctor.control_checks(project, container_mode=False)}
    assert rows["ssh key"].status == "ok" and str(key) in rows["ssh key"].detail
    assert "docker" not in rows


@pytest.mark.lab
def test_docker_check_against_the_real_daemon(tmp_path):
    check = doctor.docker_check()
    assert check.status == "ok", check.detail
