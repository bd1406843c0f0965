"""SSH host keys against a real lab host: `lab up` records its key, SSH (the Transport) and Ansible check
it, a re-keyed host stops both with the re-trust advice, and `hosts trust --replace` lets them in again.

One host in its own lab (its key gets changed here, so it must not be the shared `lab_fleet`).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from json_schemas import validate

from ddtree_ops import lab
from ddtree_ops.cli import cli
from ddtree_ops.config import load_project
from ddtree_ops.hosts.known_hosts import parse_key_line, recorded_keys
from ddtree_ops.lab.fleet import ssh_answers

pytestmark = pytest.mark.lab


def _invoke(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _in_container(container: str, command: str) -> str:
    return subprocess.run(["docker", "exec", container, "sh", "-c", command], capture_output=True, text=True, check=True).stdout


def _fingerprints_inside(container: str) -> set[str]:
    # What the host itself says its keys are (ssh-keygen -lf on each public key file, inside the container).
    out = _in_container(container, "for k in /etc/ssh/ssh_host_*_key.pub; do ssh-keygen -lf $k; done")
    return {line.split()[1] for line in out.splitlines()}


def _rekey(container: str) -> None:
    # A reinstalled host: new host keys, sshd restarted on them.
    _in_container(container, "rm -f /etc/ssh/ssh_host_* && ssh-keygen -A && systemctl restart ssh")


@pytest.fixture(scope="module")
def one_host_lab(tmp_path_factory):
    from ddtree_ops.lab.docker import DockerUnavailable, ensure_docker

    try:
        ensure_docker()
    except DockerUnavailable as err:
        pytest.skip(f"lab tests need Docker: {err}")
    lab_dir = tmp_path_factory.mktemp("keys") / "lab"
    try:  # a failed `up` leaves nothing behind either
        yield lab.up(1, lab_dir)
    finally:
        lab.down(lab_dir)


def test_lab_up_records_the_hosts_own_keys_and_ssh_checks_them(one_host_lab):
    (host,) = one_host_lab.hosts
    config = Path(one_host_lab.config_path)
    known_hosts = config.parent / "known_hosts"
    project = load_project(config)
    assert project.host("lab-1").known_hosts == known_hosts.absolute()
    recorded = recorded_keys(known_hosts, host.address)  # port 22: the bare address
    assert recorded and {k.fingerprint for k in recorded} == _fingerprints_inside(host.container)
    # The same key under another address is refused: checking is on, and uses this file only.
    other = known_hosts.parent / "other_known_hosts"
    other.write_text("".join(f"192.0.2.1 {k.key_type} {k.blob}\n" for k in recorded))
    assert ssh_answers(host.address, Path(project.host("lab-1").ssh.key)) is True
    assert ssh_answers(host.address, Path(project.host("lab-1").ssh.key), known_hosts=other) is False


def test_a_rekeyed_host_stops_ssh_and_ansible_until_trusted_again(one_host_lab):
    (host,) = one_host_lab.hosts
    config = Path(one_host_lab.config_path)
    known_hosts = config.parent / "known_hosts"

    # Checking on, keys as recorded: the probe (SSH) and a playbook (Ansible) both get in.
    plan = _invoke("-c", config, "provision", "--plan", "--json")
    assert plan.exit_code == 0, plan.output
    assert [(h["host"], h["ok"]) for h in json.loads(plan.stdout)["hosts"]] == [("lab-1", True)]

    _rekey(host.container)
    new_fingerprints = _fingerprints_inside(host.container)
    before = known_hosts.read_text()
    advice = f"ddtree-ops -c {config} hosts trust lab-1 --replace"

    # SSH: exit 1, naming the host, the file and the exact command; not "unreachable".
    plan = _invoke("-c", config, "provision", "--plan")
    assert plan.exit_code == 1, plan.output
    assert "lab-1" in plan.output and "has CHANGED" in plan.output and str(known_hosts) in plan.output
    assert advice in plan.output and "unreachable" not in plan.output
    assert any(fp in plan.output for fp in new_fingerprints), "the message quotes the key the host offers now"
    doctor = _invoke("-c", config, "doctor", "--no-manifest")
    assert doctor.exit_code == 1 and advice in doctor.output, doctor.output

    # Ansible (a playbook that changes nothing on this host): the same, through its "unreachable" report.
    undeploy = _invoke("-c", config, "undeploy", "--all", "--yes")
    assert undeploy.exit_code == 1, undeploy.output
    assert "has CHANGED" in undeploy.output and advice in undeploy.output, undeploy.output

    # trust without --replace refuses, and writes nothing.
    refused = _invoke("-c", config, "hosts", "trust", "lab-1")
    assert refused.exit_code == 1 and advice in refused.output, refused.output
    assert known_hosts.read_text() == before

    # trust --replace records the new keys (their fingerprints are the host's own) and both paths work again.
    replaced = _invoke("-c", config, "hosts", "trust", "lab-1", "--replace", "--json")
    assert replaced.exit_code == 0, replaced.output
    (row,) = validate(json.loads(replaced.stdout))["hosts"]
    assert row["status"] == "replaced" and {k["fingerprint"] for k in row["keys"]} == new_fingerprints
    assert {k.fingerprint for k in recorded_keys(known_hosts, host.address)} == new_fingerprints
    assert _invoke("-c", config, "provision", "--plan").exit_code == 0
    undeploy = _invoke("-c", config, "undeploy", "--all", "--yes")
    assert undeploy.exit_code == 0, undeploy.output
    again = _invoke("-c", config, "hosts", "trust")
    assert again.exit_code == 0 and "unchanged" in again.stdout, again.output


def test_a_host_with_no_recorded_key_is_refused_until_trusted(one_host_lab):
    (host,) = one_host_lab.hosts
    config = Path(one_host_lab.config_path)
    known_hosts = config.parent / "known_hosts"
    known_hosts.unlink()

    plan = _invoke("-c", config, "provision", "--plan")
    assert plan.exit_code == 1, plan.output
    assert f"not recorded in {known_hosts}" in plan.output and f"ddtree-ops -c {config} hosts trust lab-1`" in plan.output

    trusted = _invoke("-c", config, "hosts", "trust")
    assert trusted.exit_code == 0, trusted.output
    assert "recorded" in trusted.stdout and all(fp in trusted.stdout for fp in _fingerprints_inside(host.container))
    lines = [parse_key_line(line) for line in known_hosts.read_text().splitlines()]
    assert {names for names, _ in lines} == {host.address}
    assert _invoke("-c", config, "provision", "--plan").exit_code == 0

    # `lab up` again (the container reused, its keys unchanged) leaves the same file.
    before = known_hosts.read_text()
    lab.up(1, Path(one_host_lab.lab_dir))
    assert sorted(known_hosts.read_text().splitlines()) == sorted(before.splitlines())

    # A recreated host (new container, new keys, likely the same address): `lab up` re-records its keys.
    old = _fingerprints_inside(host.container)
    subprocess.run(["docker", "rm", "-f", host.container], capture_output=True, check=True)
    (recreated,) = lab.up(1, Path(one_host_lab.lab_dir)).hosts
    new = _fingerprints_inside(recreated.container)
    assert new != old and {k.fingerprint for k in recorded_keys(known_hosts, recreated.address)} == new
    assert _invoke("-c", config, "provision", "--plan").exit_code == 0
