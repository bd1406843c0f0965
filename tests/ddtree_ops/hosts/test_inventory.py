from __future__ import annotations

from pathlib import Path

import pytest

from ddtree_ops.config import parse_project
from ddtree_ops.exceptions import ConfigError
from ddtree_ops.hosts.inventory import build_inventory


def _project(hosts: list[dict]):
    return parse_project(
        {
            "hosts": hosts,
            "engine": {"target": "lab", "draft": "lab"},
            "services": [{"name": "baseline", "algorithm": "dflash", "port": 30000}],
        }
    )


def test_inventory_carries_each_hosts_connection_settings():
    project = _project(
        [
            {"name": "a", "address": "10.0.0.1", "ssh": {"key": "~/.ssh/lab", "port": 2222}},
            {"name": "b", "address": "b.example", "ssh": {"user": "ops"}},
        ]
    )
    hosts = build_inventory(project, project.hosts)["all"]["children"]["ddtree"]["hosts"]

    assert list(hosts) == ["a", "b"]
    assert hosts["a"]["ansible_host"] == "10.0.0.1"
    assert hosts["a"]["ansible_port"] == 2222
    assert hosts["a"]["ansible_user"] == "root"
    assert hosts["a"]["ansible_ssh_private_key_file"] == str(Path("~/.ssh/lab").expanduser())
    assert "ansible_become" not in hosts["a"]
    assert "-o StrictHostKeyChecking=yes" in hosts["a"]["ansible_ssh_common_args"]
    assert hosts["a"]["ansible_host_key_checking"] is True  # else Ansible adds its own "no" ahead of ours
    assert f"-o UserKnownHostsFile={Path('known_hosts').absolute()}" in hosts["a"]["ansible_ssh_common_args"]
    # no key: the agent / default keys; a non-root user escalates with sudo
    assert "ansible_ssh_private_key_file" not in hosts["b"]
    assert hosts["b"]["ansible_user"] == "ops" and hosts["b"]["ansible_become"] is True


def test_inventory_of_a_subset_lists_only_those_hosts():
    project = _project([{"name": "a", "address": "10.0.0.1"}, {"name": "b", "address": "10.0.0.2"}])
    hosts = build_inventory(project, [project.host("b")])["all"]["children"]["ddtree"]["hosts"]
    assert list(hosts) == ["b"]


def test_inventory_refuses_a_host_outside_the_project():
    project = _project([{"name": "a", "address": "10.0.0.1"}])
    other = _project([{"name": "x", "address": "10.0.0.9"}])
    with pytest.raises(ConfigError, match="unknown host 'x'"):
        build_inventory(project, other.hosts)
