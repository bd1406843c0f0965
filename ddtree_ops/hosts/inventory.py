"""The Ansible inventory for a set of project hosts, built in memory (never written by hand)."""

from __future__ import annotations

from pathlib import Path

from ..config import Host, Project

# Host keys are not verified: lab hosts get new keys on every `lab up`, and `hosts/ssh.py` (every
# other SSH command) makes the same choice, so both paths see hosts the same way.
SSH_COMMON_ARGS = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=15"


def host_vars(host: Host) -> dict:
    """Connection variables for one host."""
    hv: dict = {
        "ansible_host": host.address,
        "ansible_user": host.ssh.user,
        "ansible_port": host.ssh.port,
        "ansible_ssh_common_args": SSH_COMMON_ARGS,
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
