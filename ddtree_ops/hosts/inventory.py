"""The Ansible inventory for a set of project hosts, built in memory (never written by hand)."""

from __future__ import annotations

import shlex
from pathlib import Path

from ..config import Host, Project
from .ssh import host_key_options

# Host keys are checked against the project's known_hosts, as by every other SSH command (`hosts/ssh.py`
# gives the options); `ansible_host_key_checking` keeps Ansible from switching ssh's checking off itself.
SSH_COMMON_OPTIONS = ("StrictHostKeyChecking=yes", "LogLevel=ERROR", "ConnectTimeout=15")


def ssh_common_args(host: Host) -> str:
    """`ansible_ssh_common_args` for `host`: one `-o` per option, each shell-quoted (Ansible splits it like a shell)."""
    options = (*SSH_COMMON_OPTIONS, *host_key_options(host))
    return " ".join(f"-o {shlex.quote(option)}" for option in options)


def host_vars(host: Host) -> dict:
    """Connection variables for one host."""
    hv: dict = {
        "ansible_host": host.address,
        "ansible_user": host.ssh.user,
        "ansible_port": host.ssh.port,
        "ansible_ssh_common_args": ssh_common_args(host),
        # Above every config and environment setting (ansible-runner turns it off in the environment).
        "ansible_host_key_checking": True,
        # The host's system python runs Ansible's modules; the engine gets its own venv.
        "ansible_python_interpreter": "/usr/bin/python3",
    }
    if host.ssh.key:
        hv["ansible_ssh_private_key_file"] = str(Path(host.ssh.key).expanduser())
    if host.ssh.user != "root":
        hv["ansible_become"] = True
    return hv


def build_inventory(project: Project, hosts: list[Host]) -> dict:
    """An ansible-runner inventory (YAML-shaped dict): every host in group `ddtree`.

    Args:
        project: the validated project (only its hosts' connection settings are used).
        hosts: the hosts to target, a subset of `project.hosts`.
    Returns:
        `{"all": {"children": {"ddtree": {"hosts": {name: {ansible_host: …, …}}}}}}`
    """
    known = {h.name for h in project.hosts}
    for host in hosts:
        if host.name not in known:
            project.host(host.name)  # raises ConfigError naming the host
    return {"all": {"children": {"ddtree": {"hosts": {h.name: host_vars(h) for h in hosts}}}}}
