"""provision without lab hosts: lock hashing, facts, the sglang seam, and bad input → exit 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ddtree_ops.cli import cli
from ddtree_ops.config import parse_project
from ddtree_ops.exceptions import ConfigError, HostError
from ddtree_ops.provision.lock import Lock, python_tag, resolve_lock
from ddtree_ops.provision.run import FACTS_TASK, MANIFEST_TASK, facts_from_event, manifest_from_event
from ddtree_ops.provision.engine_source import engine_source_digest
from ddtree_ops.provision.wheelhouse import compatible_platforms, pin_of_wheel

REQS = ("numpy==2.4.6", "torch==2.13.0+cpu", "ddtree-engine==0.1.0")


def _lock(**changes) -> Lock:
    fields = {
        "backend": "reference", "python_tag": "cp311", "platform": "manylinux_2_28_x86_64", "requirements": REQS, "engine_source": "e" * 64
    }
    fields.update(changes)
    return Lock(**fields)


def test_lock_hash_ignores_requirement_order():
    assert _lock().hash == _lock(requirements=tuple(reversed(REQS))).hash


@pytest.mark.parametrize(
    "change",
    [
        {"requirements": ("numpy==2.4.5", "torch==2.13.0+cpu", "ddtree-engine==0.1.0")},
        {"requirements": REQS + ("rich==15.0.0",)},
        {"python_tag": "cp312"},
        {"platform": "manylinux_2_17_x86_64"},
        {"engine_source": "f" * 64},
    ],
)
def test_lock_hash_changes_with_any_pinned_input(change):
    assert _lock(**change).hash != _lock().hash


def test_lock_short_hash_names_the_env_and_requirements_are_sorted():
    lock = _lock()
    assert len(lock.hash) == 64 and lock.short_hash == lock.hash[:16]
    assert lock.requirements_text().splitlines() == sorted(REQS)
    assert lock.to_dict()["short_hash"] == lock.short_hash


def test_pin_of_wheel_normalises_names_and_keeps_local_versions():
    assert pin_of_wheel("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl") == "torch==2.13.0+cpu"
    assert pin_of_wheel("typing_extensions-4.16.0-py3-none-any.whl") == "typing-extensions==4.16.0"
    assert pin_of_wheel("PyYAML-6.0.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl") == "pyyaml==6.0.4"
    with pytest.raises(ValueError):
        pin_of_wheel("numpy-2.4.6.tar.gz")


def test_compatible_platforms_include_older_manylinux_tags():
    tags = compatible_platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64"
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags


def test_engine_source_digest_follows_the_sources_not_the_caches(tmp_path):
    (tmp_path / "src" / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text("[project]\nname='x'\nversion='1'\n")
    (tmp_path / "src" / "pkg" / "a.py").write_text("A = 1\n")
    before = engine_source_digest(tmp_path)
    (tmp_path / "src" / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"junk")
    assert engine_source_digest(tmp_path) == before
    (tmp_path / "src" / "pkg" / "a.py").write_text("A = 2\n")
    assert engine_source_digest(tmp_path) != before


def _project_doc(**engine) -> dict:
    return {
        "hosts": [{"name": "lab-1", "address": "127.0.0.1"}],
        "engine": {"target": "lab", "draft": "lab", **engine},
        "services": [{"name": "baseline", "algorithm": "dflash", "port": 30000}],
    }


def test_resolve_lock_sends_sglang_to_the_probe_based_resolver():
    project = parse_project(_project_doc(backend="sglang"))
    with pytest.raises(ConfigError, match="an sglang lock needs the host's probe"):
        resolve_lock(project, project.hosts[0], {"python_version": "3.11.2", "architecture": "x86_64"})


def test_resolve_lock_refuses_other_architectures():
    project = parse_project(_project_doc())
    with pytest.raises(ConfigError, match="aarch64"):
        resolve_lock(project, project.hosts[0], {"python_version": "3.11.2", "architecture": "aarch64"})


def test_python_tag_from_facts():
    host = parse_project(_project_doc()).hosts[0]
    assert python_tag({"python_version": "3.11.2"}, host) == "cp311"
    assert python_tag({"python_version": "3.12.0"}, host) == "cp312"
    with pytest.raises(ConfigError, match="lab-1"):
        python_tag({"python_version": ".."}, host)


def test_facts_come_from_the_facts_task_event():
    event = {
        "event": "runner_on_ok",
        "event_data": {
            "host": "lab-1",
            "task": FACTS_TASK,
            "res": {
                "ansible_facts": {
                    "ansible_python": {"version": {"major": 3, "minor": 11, "micro": 2}, "executable": "/usr/bin/python3"},
                    "ansible_architecture": "x86_64",
                    "ansible_distribution": "Debian",
                    "ansible_distribution_version": "12.15",
                }
            },
        },
    }
    host, facts = facts_from_event(event)
    assert host == "lab-1"
    assert facts["python_version"] == "3.11.2" and facts["architecture"] == "x86_64"
    assert facts_from_event({**event, "event": "runner_on_failed"}) is None


def test_manifest_comes_from_the_manifest_task_event():
    fixture = Path(__file__).resolve().parents[2] / "fixtures" / "manifests" / "h200-manifest.json"
    event = {
        "event": "runner_on_ok",
        "event_data": {"host": "lab-2", "task": MANIFEST_TASK, "res": {"rc": 0, "stdout": fixture.read_text()}},
    }
    host, manifest = manifest_from_event(event)
    assert host == "lab-2" and manifest.ok and manifest.torch_cuda == "13.0"
    assert manifest_from_event({**event, "event_data": {**event["event_data"], "task": FACTS_TASK}}) is None
    garbled = {**event, "event_data": {**event["event_data"], "res": {"rc": 1, "stdout": "Traceback (most recent call last):"}}}
    with pytest.raises(HostError, match="host lab-2: the ABI manifest script did not print a valid manifest"):
        manifest_from_event(garbled)


@pytest.mark.parametrize("mode", ["venv", "container"])
def test_the_role_runs_the_manifest_task_that_provision_listens_for(mode):
    # The task name is the contract between the role and manifest_from_event, in both modes.
    tasks_dir = Path(__file__).resolve().parents[3] / "ansible" / "roles" / "ddtree_provision" / "tasks"
    assert f"- name: {MANIFEST_TASK}\n" in (tasks_dir / f"{mode}.yml").read_text()
    assert '"{{ ddtree_provision_mode }}.yml"' in (tasks_dir / "main.yml").read_text()


# ---- bad input: exit 2, the key named, no host touched -------------------------------------------

GOOD = {
    "hosts": [{"name": "lab-1", "address": "127.0.0.1", "ssh": {"port": 1}}],
    "engine": {"backend": "reference", "target": "lab", "draft": "lab"},
    "services": [
        {"name": "baseline", "algorithm": "dflash", "port": 30000},
        {"name": "tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "port": 30001},
    ],
}


def _with(path: list, value) -> dict:
    doc = json.loads(json.dumps(GOOD))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    "doc, key",
    [
        (_with(["engine", "blok_size"], 16), "blok_size"),
        (_with(["hosts", 0, "ssh", "port"], "twenty-two"), "hosts[0].ssh.port"),
        (_with(["services", 1, "port"], 30000), "services[1].port"),
        (_with(["services", 1, "budget"], -1), "services[1].budget"),
        (_with(["services", 1, "topk"], 0), "services[1].topk"),
    ],
    ids=["unknown-key", "wrong-type", "port-used-twice", "budget-below-0", "topk-below-1"],
)
def test_provision_refuses_a_malformed_project_file(tmp_path, doc, key):
    path = tmp_path / "ddtree.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(cli, ["-c", str(path), "provision"], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert key in result.output
    _assert_no_ansible_ran()


def test_provision_refuses_an_unknown_host_name(tmp_path):
    path = tmp_path / "ddtree.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    result = CliRunner().invoke(cli, ["-c", str(path), "provision", "lab-1", "lab-9"], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert "unknown host 'lab-9'" in result.output
    _assert_no_ansible_ran()


@pytest.mark.parametrize(
    "engine_change, message",
    [
        ({"install": {"mode": "container"}}, "no Docker Engine answers here"),
    ],
)
def test_provision_refuses_what_it_cannot_do_yet_before_touching_hosts(tmp_path, monkeypatch, engine_change, message):
    # Container mode builds its image here: with no Docker Engine to talk to, nothing may start.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    doc = json.loads(json.dumps(GOOD))
    doc["engine"].update(engine_change)
    path = tmp_path / "ddtree.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(cli, ["-c", str(path), "provision"], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert message in result.output
    _assert_no_ansible_ran()


def _assert_no_ansible_ran() -> None:
    logs = Path(os.environ["DDTREE_STATE_DIR"]) / "logs"
    assert not logs.exists() or not any(logs.iterdir())


def test_an_unreachable_host_is_named_with_how_to_check_it(tmp_path):
    # Port 1 on loopback refuses at once: real Ansible, a real SSH failure, no lab needed.
    path = tmp_path / "ddtree.yaml"
    path.write_text(yaml.safe_dump(_with(["hosts", 0, "ssh", "key"], str(tmp_path / "no-such-key"))))
    result = CliRunner().invoke(cli, ["-c", str(path), "provision"], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert "host lab-1 (127.0.0.1:1) is unreachable over SSH" in result.output
    assert f"ssh -i {tmp_path / 'no-such-key'} -p 1 root@127.0.0.1" in result.output
    logs = list((Path(os.environ["DDTREE_STATE_DIR"]) / "logs").iterdir())
    assert len(logs) == 1 and "UNREACHABLE" in logs[0].read_text()


# ---- sglang: every host resolved from its probe before any is changed ---------------------------

FIXTURE_HOSTS = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"


def _sglang_project(*names: str, release: str | None = None):
    engine = {"backend": "sglang", "target": "/models/t", "draft": "/models/d"}
    if release:
        engine["sglang_version"] = release
    return parse_project(
        {
            "hosts": [{"name": n, "address": f"10.0.0.{i + 1}"} for i, n in enumerate(names)],
            "engine": engine,
            "services": [{"name": "tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "port": 30001}],
        }
    )


def _fixture_probe(host):
    from ddtree_ops.hosts import probe

    return probe.load_facts(FIXTURE_HOSTS / f"{host.name}-probe.json")


def test_sglang_hosts_get_their_cuda_locks_from_the_probe():
    from ddtree_ops.provision.run import resolve_sglang_locks

    project = _sglang_project("h200", "rtx6000-580")
    locks = resolve_sglang_locks(project, project.hosts, _fixture_probe)
    assert {name: (lock.cuda_flavour, lock.gpu_archs) for name, lock in locks.items()} == {
        "h200": ("cu130", ("sm_90",)),
        "rtx6000-580": ("cu130", ("sm_120",)),
    }


def test_one_unfit_host_stops_provision_before_any_host_is_changed():
    from ddtree_ops.exceptions import HostError
    from ddtree_ops.provision.run import resolve_sglang_locks

    project = _sglang_project("h200", "rtx6000-570")
    with pytest.raises(HostError) as err:
        resolve_sglang_locks(project, project.hosts, _fixture_probe)
    assert str(err.value).startswith("no host was changed; no lock fits:")
    assert "host rtx6000-570 has driver 570.153.02 — upgrade the driver" in str(err.value)


def test_a_release_the_engine_cannot_share_an_env_with_is_a_config_error():
    from ddtree_ops.provision.run import resolve_sglang_locks

    project = _sglang_project("a100-535", release="0.5.6")
    with pytest.raises(ConfigError, match="transformers==4.57.1 and the DDTree engine needs transformers==5.19.0"):
        resolve_sglang_locks(project, project.hosts, _fixture_probe)


def test_in_container_mode_an_sglang_lock_is_made_for_the_base_images_python():
    from ddtree_ops.provision.run import resolve_sglang_locks

    doc = _sglang_project("a100-535").model_dump()
    doc["engine"]["install"]["mode"] = "container"
    doc["engine"]["sglang_version"] = None
    project = parse_project(doc)

    def a100_on_580(host):
        import dataclasses

        return dataclasses.replace(_fixture_probe(host), driver_version="580.65.06")  # Python 3.10 on the host

    (lock,) = resolve_sglang_locks(project, project.hosts, a100_on_580).values()
    # cu130's base is nvidia/cuda:…-ubuntu24.04, whose Python is 3.12: the host's 3.10 does not matter.
    assert (lock.cuda_flavour, lock.python_tag) == ("cu130", "cp312")


def test_in_container_mode_the_hosts_old_glibc_does_not_matter():
    import dataclasses

    from ddtree_ops.provision.plan import plan_provision
    from ddtree_ops.provision.resolve import Refusal

    venv_project = _sglang_project("h200")
    old = dataclasses.replace(_fixture_probe(venv_project.hosts[0]), glibc="2.31")
    refused = plan_provision(venv_project, venv_project.hosts[0], old)
    assert isinstance(refused.refusal, Refusal) and refused.refusal.codes == ("glibc",)
    assert "or container mode" in refused.refusal.message
    doc = venv_project.model_dump()
    doc["engine"]["install"]["mode"] = "container"
    container_project = parse_project(doc)
    planned = plan_provision(container_project, container_project.hosts[0], old)
    assert planned.lock is not None and planned.lock.python_tag == "cp312", "the image's glibc and Python count"
    # The plan shows the facts the lock was made from: the image's Python, no host glibc.
    assert (planned.facts.python_version, planned.facts.glibc) == ("3.12", None)
