"""Host keys are checked: the ssh and Ansible arguments, the project's known_hosts (where it is, how it is
read and written), fingerprints, what ssh's refusal turns into, and `hosts trust`'s bookkeeping.

OpenSSH's own tools judge what we write: `ssh-keygen -F` looks entries up the way ssh does, and
`ssh-keygen -lf` gives the fingerprints ours must equal. A real host's refusal is in the lab test
(tests/ddtree_ops/lab/test_host_keys_lab.py).
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from json_schemas import validate

from ddtree_ops.cli import cli
from ddtree_ops.config import load_project, parse_project
from ddtree_ops.exceptions import HostError, HostKeyError
from ddtree_ops.hosts import known_hosts as kh
from ddtree_ops.hosts.ansible import _HostProgress, _Progress, _raise_on_failure, HostOutcome, PlaybookResult
from ddtree_ops.hosts.inventory import build_inventory
from ddtree_ops.hosts.ssh import Transport, ssh_argv
from ddtree_ops.hosts.trust import CHANGED, RECORDED, REPLACED, UNCHANGED, trust_host, trust_hosts

REPO = Path(__file__).resolve().parents[3]

# What OpenSSH 9.2 prints (exit 255) when StrictHostKeyChecking=yes refuses a host (captured from the lab).
SSH_CHANGED = """@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!
Someone could be eavesdropping on you right now (man-in-the-middle attack)!
It is also possible that a host key has just been changed.
The fingerprint for the ED25519 key sent by the remote host is
SHA256:Al0c7rz4MKxseIRrgIqk0dPOCrM2B6fYcaiPIhhZtG0.
Please contact your system administrator.
Add correct host key in /tmp/hk-capture/lab/known_hosts to get rid of this message.
Offending ED25519 key in /tmp/hk-capture/lab/known_hosts:1
  remove with:
  ssh-keygen -f "/tmp/hk-capture/lab/known_hosts" -R "172.20.0.2"
Host key for 172.20.0.2 has changed and you have requested strict checking.
Host key verification failed.
"""
SSH_MISSING = "No ED25519 host key is known for 172.20.0.2 and you have requested strict checking.\nHost key verification failed.\n"


def _doc(hosts: list[dict], **extra) -> dict:
    return {
        "hosts": hosts,
        "engine": {"target": "lab", "draft": "lab"},
        "services": [{"name": "baseline", "algorithm": "dflash", "port": 30000}],
        **extra,
    }


def _write(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def _keygen(tmp_path: Path, name: str, key_type: str = "ed25519") -> kh.HostKey:
    key = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", key_type, "-N", "", "-f", str(key)], check=True)
    fields = key.with_suffix(".pub").read_text().split()
    return kh.HostKey(fields[0], fields[1])


def _option(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1].split("=", 1)[1] for i, a in enumerate(argv[:-1]) if a == "-o" and argv[i + 1].startswith(name + "=")]


# ---- where the file is, and the arguments that use it ------------------------------------------


def test_the_known_hosts_file_is_beside_the_project_file_unless_the_project_names_one(tmp_path):
    beside = load_project(_write(tmp_path / "a" / "ddtree.yaml", _doc([{"name": "h", "address": "10.0.0.1"}])))
    assert beside.host("h").known_hosts == (tmp_path / "a" / "known_hosts")
    relative = load_project(_write(tmp_path / "b" / "p.yaml", _doc([{"name": "h", "address": "10.0.0.1"}], ssh={"known_hosts": "keys/hosts"})))
    assert relative.host("h").known_hosts == tmp_path / "b" / "keys" / "hosts"  # relative to the project file, not the cwd
    absolute = load_project(_write(tmp_path / "c" / "p.yaml", _doc([{"name": "h", "address": "10.0.0.1"}], ssh={"known_hosts": "/etc/ddtree/known"})))
    assert absolute.host("h").known_hosts == Path("/etc/ddtree/known")


def test_a_misspelt_ssh_key_is_bad_input_naming_the_key():
    with pytest.raises(Exception, match=r"ssh.known_host: unknown key 'known_host': did you mean 'known_hosts'"):
        parse_project(_doc([{"name": "h", "address": "10.0.0.1"}], ssh={"known_host": "x"}))


def test_ssh_checks_the_key_against_the_projects_file_only(tmp_path):
    project = load_project(_write(tmp_path / "my project" / "ddtree.yaml", _doc([{"name": "h", "address": "10.0.0.1", "ssh": {"port": 2222}}])))
    argv = ssh_argv(project.host("h"), "true")
    assert _option(argv, "StrictHostKeyChecking") == ["yes"]
    assert _option(argv, "UserKnownHostsFile") == [str(tmp_path / "my project" / "known_hosts")]
    assert _option(argv, "GlobalKnownHostsFile") == ["/dev/null"] and _option(argv, "UpdateHostKeys") == ["no"]
    assert _option(argv, "BatchMode") == ["yes"]  # never a prompt to accept a key


def test_ansible_gets_the_same_options_quoted_for_its_shell_split(tmp_path):
    project = load_project(_write(tmp_path / "my project" / "ddtree.yaml", _doc([{"name": "h", "address": "10.0.0.1"}])))
    args = build_inventory(project, project.hosts)["all"]["children"]["ddtree"]["hosts"]["h"]["ansible_ssh_common_args"]
    split = shlex.split(args)  # what Ansible's ssh plugin does with it
    assert _option(split, "UserKnownHostsFile") == [str(tmp_path / "my project" / "known_hosts")]
    assert _option(split, "StrictHostKeyChecking") == ["yes"] and _option(split, "GlobalKnownHostsFile") == ["/dev/null"]
    assert set(_option(split, "UserKnownHostsFile") + _option(split, "StrictHostKeyChecking")) <= {
        *_option(ssh_argv(project.host("h"), "true"), "UserKnownHostsFile"), "yes"
    }


def test_ansible_cfg_does_not_turn_checking_off():
    # host_key_checking = False makes Ansible put `-o StrictHostKeyChecking=no` before our arguments (ssh keeps the first).
    cfg = (REPO / "ansible" / "ansible.cfg").read_text()
    assert "host_key_checking = True" in cfg and "host_key_checking = False" not in cfg


def test_nothing_turns_host_key_checking_off():
    offenders = []
    for folder in ("ddtree_ops", "ansible", "docker", "examples", "engine_patches"):
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".yml", ".yaml", ".cfg", ".sh", ".j2", ".service", ""):
                text = path.read_text(errors="replace")
                if "StrictHostKeyChecking=no" in text or "UserKnownHostsFile=/dev/null" in text:
                    offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


# ---- the file: names, fingerprints, recording --------------------------------------------------


def test_fingerprints_are_what_ssh_keygen_prints(tmp_path):
    for key_type in ("ed25519", "rsa", "ecdsa"):
        key = _keygen(tmp_path, f"k_{key_type}", key_type)
        expected = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / f"k_{key_type}.pub")], capture_output=True, text=True, check=True).stdout.split()[1]
        assert key.fingerprint == expected


@pytest.mark.parametrize(("port", "pattern"), [(22, "10.0.0.1"), (2222, "[10.0.0.1]:2222")])
def test_recorded_entries_are_found_by_ssh_keygen_the_way_ssh_looks_them_up(tmp_path, port, pattern):
    key, path = _keygen(tmp_path, "k"), tmp_path / "known_hosts"
    assert kh.host_pattern("10.0.0.1", port) == pattern
    kh.record_keys(path, pattern, [key])
    found = subprocess.run(["ssh-keygen", "-F", pattern, "-f", str(path)], capture_output=True, text=True)
    assert found.returncode == 0 and key.blob in found.stdout
    other = "10.0.0.1" if port != 22 else "[10.0.0.1]:2222"  # the other port's name finds nothing
    assert subprocess.run(["ssh-keygen", "-F", other, "-f", str(path)], capture_output=True).returncode == 1


def test_replace_removes_that_hosts_entries_only(tmp_path):
    a1, a2, b, c = (_keygen(tmp_path, n) for n in ("a1", "a2", "b", "c"))
    path = tmp_path / "known_hosts"
    path.write_text(
        "# kept comment\n"
        f"10.0.0.1 {a1.key_type} {a1.blob}\n"
        f"10.0.0.2,10.0.0.1 {b.key_type} {b.blob}\n"  # a line shared with another host: only our name goes
        f"[10.0.0.1]:2222 {c.key_type} {c.blob}\n"  # the same address on another port is another host
    )
    kh.record_keys(path, "10.0.0.1", [a2], replace=True)
    assert kh.recorded_keys(path, "10.0.0.1") == [a2]
    assert kh.recorded_keys(path, "10.0.0.2") == [b] and kh.recorded_keys(path, "[10.0.0.1]:2222") == [c]
    assert path.read_text().startswith("# kept comment\n")


def test_hashed_entries_are_recognised(tmp_path):
    key, path = _keygen(tmp_path, "k"), tmp_path / "known_hosts"
    path.write_text(f"[10.0.0.1]:2222 {key.key_type} {key.blob}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(path)], capture_output=True, check=True)
    assert path.read_text().startswith("|1|")
    assert kh.recorded_keys(path, "[10.0.0.1]:2222") == [key] and kh.recorded_keys(path, "10.0.0.1") == []
    kh.record_keys(path, "[10.0.0.1]:2222", [], replace=True)
    assert kh.recorded_keys(path, "[10.0.0.1]:2222") == []


def test_keyscan_output_is_parsed_without_its_comments():
    text = "# 10.0.0.1:22 SSH-2.0-OpenSSH_9.2p1\n10.0.0.1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA\n\n10.0.0.1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA\n"
    assert kh.parse_keyscan(text) == [kh.HostKey("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIA")]


# ---- ssh's refusal, in both paths ---------------------------------------------------------------


def _bound_host(tmp_path, port=2222):
    return load_project(_write(tmp_path / "ddtree.yaml", _doc([{"name": "h1", "address": "127.0.0.1", "ssh": {"port": port}}]))).host("h1")


def test_ssh_stderr_tells_a_changed_key_from_a_missing_one_from_an_unreachable_host():
    assert kh.host_key_problem(SSH_CHANGED) == kh.CHANGED
    assert kh.host_key_problem(SSH_MISSING) == kh.MISSING
    assert kh.host_key_problem("ssh: connect to host 127.0.0.1 port 9: Connection refused") is None


class Answers(Transport):
    def __init__(self, rc: int, stderr: str):
        self.rc, self.stderr = rc, stderr

    def call(self, host, remote_command, **_):
        return subprocess.CompletedProcess(remote_command, self.rc, "", self.stderr)


def test_a_refused_key_is_a_host_key_error_with_the_exact_trust_command(tmp_path):
    host = _bound_host(tmp_path)
    with pytest.raises(HostKeyError) as changed:
        Answers(255, SSH_CHANGED).exec(host, "true", timeout_s=5)
    message = str(changed.value)
    assert "host h1 (root@127.0.0.1:2222)" in message and "has CHANGED" in message and str(tmp_path / "known_hosts") in message
    assert f"`ddtree-ops -c {tmp_path / 'ddtree.yaml'} hosts trust h1 --replace`" in message
    assert "SHA256:Al0c7rz4MKxseIRrgIqk0dPOCrM2B6fYcaiPIhhZtG0" in message and "unreachable" not in message
    with pytest.raises(HostKeyError, match=r"not recorded in .*known_hosts.*`ddtree-ops -c \S+ hosts trust h1`"):
        Answers(255, SSH_MISSING).exec(host, "true", timeout_s=5)
    with pytest.raises(HostError, match="unreachable over SSH") as unreachable:
        Answers(255, "Connection refused").exec(host, "true", timeout_s=5)
    assert not isinstance(unreachable.value, HostKeyError)


def test_ansibles_unreachable_report_of_a_refused_key_is_a_host_key_error(tmp_path):
    host = _bound_host(tmp_path)
    progress = _Progress([host])
    progress.hosts["h1"] = _HostProgress(unreachable=True, messages=[f"Failed to connect to the host via ssh: {SSH_CHANGED}"])
    result = PlaybookResult("failed", 4, {"h1": HostOutcome(0, 0, 0, True)}, tmp_path / "log")
    with pytest.raises(HostKeyError, match=r"has CHANGED[\s\S]*hosts trust h1 --replace"):
        _raise_on_failure(result, [host], progress, "")
    progress.hosts["h1"] = _HostProgress(unreachable=True, messages=["Failed to connect to the host via ssh: Connection refused"])
    with pytest.raises(HostError, match="is unreachable over SSH") as unreachable:
        _raise_on_failure(result, [host], progress, "")
    assert not isinstance(unreachable.value, HostKeyError)


# ---- hosts trust --------------------------------------------------------------------------------


def test_trust_records_keeps_refuses_and_replaces(tmp_path):
    host = _bound_host(tmp_path)
    old, new = _keygen(tmp_path, "old"), _keygen(tmp_path, "new")
    assert trust_host(host, [old]).status == RECORDED
    assert trust_host(host, [old]).status == UNCHANGED
    before = host.known_hosts.read_text()
    refused = trust_host(host, [new])
    assert refused.status == CHANGED and not refused.ok and host.known_hosts.read_text() == before
    assert [k.fingerprint for k in refused.previous] == [old.fingerprint] and "--replace" in refused.error
    replaced = trust_host(host, [new], replace=True)
    assert replaced.status == REPLACED and kh.recorded_keys(host.known_hosts, "[127.0.0.1]:2222") == [new]


def test_trust_scans_every_host_and_reports_one_that_does_not_answer(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    host = _bound_host(tmp_path, port=closed)
    (result,) = trust_hosts([host])  # the real ssh-keyscan, against a port nothing listens on
    assert result.status == "failed" and f"no SSH host key from 127.0.0.1:{closed}" in result.error
    assert not host.known_hosts.exists()


def test_trust_of_an_unknown_host_is_bad_input_listing_the_known_ones(tmp_path):
    config = _write(tmp_path / "ddtree.yaml", _doc([{"name": "gpu-1", "address": "127.0.0.1"}, {"name": "gpu-2", "address": "127.0.0.1"}]))
    result = CliRunner().invoke(cli, ["-c", str(config), "hosts", "trust", "gpu-3"], catch_exceptions=False)
    assert result.exit_code == 2 and "unknown host 'gpu-3'; the project file lists: gpu-1, gpu-2" in result.stderr
    assert not (tmp_path / "known_hosts").exists()


def test_trust_json_is_the_envelope_with_a_failure_per_host(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    config = _write(tmp_path / "ddtree.yaml", _doc([{"name": "gone", "address": "127.0.0.1", "ssh": {"port": closed}}]))
    result = CliRunner().invoke(cli, ["hosts", "trust", "-c", str(config), "--json"], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    doc = validate(json.loads(result.stdout))
    assert doc["ok"] is False and [f["host"] for f in doc["failures"]] == ["gone"]
    assert doc["hosts"][0]["status"] == "failed" and doc["hosts"][0]["pattern"] == f"[127.0.0.1]:{closed}"
