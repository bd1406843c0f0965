"""`doctor`: control-node checks on real files and tools, hosts that do not answer, and the lab fleet."""

from __future__ import annotations

import json
import socket
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
    # A socket on 127.0.0.1 that listens but never speaks: the TCP handshake completes (the kernel's
    # backlog answers it) and no SSH banner ever comes, so only the connect timeout ends the attempt.
    # Loopback only: tests never send traffic to any other address.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        config = write_project(tmp_path, [{"name": "silent", "address": "127.0.0.1", "ssh": {"port": port}}])
        result = invoke("-c", str(config), "doctor", "--connect-timeout", "2")
    assert result.exit_code == 1
    line = next(l for l in result.stdout.splitlines() if " silent " in l and "reachable" in l)
    assert line.startswith("FAIL") and f"unreachable over SSH (root@127.0.0.1:{port})" in line


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


# ---- drift: an env's installed distributions against its lock's pins ----------------------------

ENV = "/opt/ddtree/envs/0123456789abcdef"
# torch pins one CUDA build (a local version); filelock and numpy pin releases (no local part).
PINS = {"torch": "2.9.1+cu130", "filelock": "3.20.0", "numpy": "2.3.4"}
# pip leaves its own tooling in every venv: never a lock's package, never reported as extra.
TOOLING = {"pip": "25.3", "setuptools": "80.9.0", "wheel": "0.45.1"}


def drift_row(installed: dict[str, str], extras_matter: bool = True) -> tuple[str, str]:
    check = doctor.drift_verdict("gpu-1", ENV, doctor.compare_to_lock(installed, PINS), extras_matter)
    assert (check.scope, check.name) == ("gpu-1", "drift")
    return check.status, check.detail


def test_drift_matching_build_is_ok():
    # Names as the env's metadata spells them: compared canonically (PEP 503).
    assert drift_row({"Torch": "2.9.1+cu130", "FileLock": "3.20.0", "numpy": "2.3.4"} | TOOLING) == (
        "ok",
        f"{ENV}: 3 pinned packages match",
    )


def test_drift_pin_without_local_part_matches_any_local_build_of_that_release():
    # filelock is pinned as a release (3.20.0): a local build of it is still that release, as pip's ==3.20.0 says.
    installed = {"torch": "2.9.1+cu130", "filelock": "3.20.0+deb12", "numpy": "2.3.4"}
    assert drift_row(installed) == ("ok", f"{ENV}: 3 pinned packages match")


def test_drift_wrong_build_names_both_builds():
    installed = {"torch": "2.9.1+cu128", "filelock": "3.20.0", "numpy": "2.3.4"}
    assert drift_row(installed) == (
        "fail",
        f"{ENV} differs from its lock: wrong build: torch 2.9.1+cu128 installed, lock pins 2.9.1+cu130",
    )


def test_drift_release_without_local_part_is_the_wrong_build_of_a_local_pin():
    # PyPI's torch 2.9.1 is a CUDA 12.8 build with no local label: not the cu130 build the lock pins.
    installed = {"torch": "2.9.1", "filelock": "3.20.0", "numpy": "2.3.4"}
    assert drift_row(installed) == (
        "fail",
        f"{ENV} differs from its lock: wrong build: torch 2.9.1 installed, lock pins 2.9.1+cu130",
    )


def test_drift_wrong_version():
    # Another release of a pinned release, and another release of the pinned build (same cu130): both "wrong version".
    installed = {"torch": "2.9.0+cu130", "filelock": "3.20.0", "numpy": "2.3.3"}
    assert drift_row(installed) == (
        "fail",
        f"{ENV} differs from its lock: wrong version: numpy 2.3.3 installed, lock pins 2.3.4, "
        "torch 2.9.0+cu130 installed, lock pins 2.9.1+cu130",
    )


def test_drift_missing_package():
    installed = {"torch": "2.9.1+cu130", "numpy": "2.3.4"} | TOOLING
    assert drift_row(installed) == ("fail", f"{ENV} differs from its lock: missing: filelock (lock pins 3.20.0)")


def test_drift_extra_package_warns_and_keeps_exit_0():
    installed = {"torch": "2.9.1+cu130", "filelock": "3.20.0", "numpy": "2.3.4", "requests": "2.32.5"} | TOOLING
    status, detail = drift_row(installed)
    assert (status, detail) == ("warn", f"{ENV} has packages outside its lock: requests 2.32.5")
    report = doctor.DoctorReport((doctor.Check("gpu-1", "drift", status, detail),))
    assert report.exit_code == 0


def test_drift_extras_are_silent_when_the_lock_does_not_list_the_whole_env():
    installed = {"torch": "2.9.1+cu130", "filelock": "3.20.0", "numpy": "2.3.4", "requests": "2.32.5"}
    assert drift_row(installed, extras_matter=False) == ("ok", f"{ENV}: 3 pinned packages match")


def test_drift_reports_every_kind_in_one_failing_row_with_exit_1():
    installed = {"torch": "2.9.1+cu128", "numpy": "2.3.3", "requests": "2.32.5"} | TOOLING
    status, detail = drift_row(installed)
    assert (status, detail) == (
        "fail",
        f"{ENV} differs from its lock: missing: filelock (lock pins 3.20.0); "
        "wrong version: numpy 2.3.3 installed, lock pins 2.3.4; "
        "wrong build: torch 2.9.1+cu128 installed, lock pins 2.9.1+cu130; "
        "outside the lock: requests 2.32.5",
    )
    report = doctor.DoctorReport((doctor.Check("gpu-1", "drift", status, detail),))
    assert report.exit_code == 1


def test_drift_lists_ten_per_kind_then_counts_the_rest():
    pins = {f"pkg{i:02d}": "1.0" for i in range(12)}
    check = doctor.drift_verdict("gpu-1", ENV, doctor.compare_to_lock({}, pins), extras_matter=True)
    shown = ", ".join(f"pkg{i:02d} (lock pins 1.0)" for i in range(10))
    assert (check.status, check.detail) == ("fail", f"{ENV} differs from its lock: missing: {shown} (+2 more)")


def test_compare_versions_kinds():
    assert doctor.compare_versions("2.9.1+cu130", "2.9.1+cu130") == "ok"
    assert doctor.compare_versions("2.9.1+cu128", "2.9.1+cu130") == "wrong build"
    assert doctor.compare_versions("2.9.1", "2.9.1+cu130") == "wrong build"
    assert doctor.compare_versions("2.9.1+cu130", "2.9.1") == "ok"
    assert doctor.compare_versions("2.9.0+cu130", "2.9.1+cu130") == "wrong version"
    assert doctor.compare_versions("2.9.1.0", "2.9.1") == "ok"  # PEP 440: the same release
    # Not PEP 440: only the identical string matches.
    assert doctor.compare_versions("1.0-custom-build", "1.0-custom-build") == "ok"
    assert doctor.compare_versions("1.0-custom-build", "1.0") == "wrong version"


def _wheel(directory: Path, name: str, version: str) -> Path:
    """A minimal, valid pure-Python wheel of `name` at `version` (a local version allowed)."""
    import base64
    import hashlib
    import zipfile

    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: ddtree-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def record_line(path: str, text: str) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        return f"{path},sha256={digest},{len(text.encode())}"

    record = "\n".join(record_line(p, t) for p, t in files.items()) + f"\n{dist_info}/RECORD,,\n"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, t in files.items():
            zf.writestr(p, t)
        zf.writestr(f"{dist_info}/RECORD", record)
    return path


@pytest.mark.slow
def test_drift_sees_the_build_pip_really_installed_in_a_venv(tmp_path):
    # A real venv and a real pip install of a +cu128 build; doctor's own listing script reads it back.
    import sys

    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    wheel = _wheel(tmp_path, "ddtree_drift_probe", "1.0+cu128")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(env / "bin/python"), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
    )
    # Run from the env's own directory: `-c` puts the working directory on sys.path, and a checkout's egg-info would show.
    listed = subprocess.run(
        [str(env / "bin/python"), "-c", doctor._LIST_DISTS], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    installed = json.loads(listed.stdout)
    assert installed == {"ddtree_drift_probe": "1.0+cu128"}

    swapped = doctor.drift_verdict("gpu-1", str(env), doctor.compare_to_lock(installed, {"ddtree-drift-probe": "1.0+cu130"}), True)
    assert (swapped.status, swapped.detail) == (
        "fail",
        f"{env} differs from its lock: wrong build: ddtree-drift-probe 1.0+cu128 installed, lock pins 1.0+cu130",
    )
    release_pin = doctor.drift_verdict("gpu-1", str(env), doctor.compare_to_lock(installed, {"ddtree-drift-probe": "1.0"}), True)
    assert (release_pin.status, release_pin.detail) == ("ok", f"{env}: 1 pinned packages match")
