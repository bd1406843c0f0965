"""`ddtree-ops undeploy`: stop, disable and remove services from hosts (their releases stay on disk).

One host at a time through `ansible/undeploy.yml`; the services leave the host's state.json (and
`rollback` with them). In container mode stopping the unit stops its container (the unit's
ExecStop). The engine env or image stays on the host (nothing prunes old ones yet).

A service already taken out of the project file can still be named: it is removed from every
selected host that has it (hosts without it are left as they are).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..config import SERVICE_NAME_PATTERN, Project
from ..exceptions import ConfigError, HostError
from ..hosts.ansible import run_playbook

UNDEPLOY_PLAYBOOK = "undeploy.yml"


@dataclass
class HostUndeploy:
    host: str
    services: list[str]
    changed: int | None = None
    error: str | None = None


@dataclass
class UndeployReport:
    ok: bool
    hosts: list[HostUndeploy] = field(default_factory=list)
    failure: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_undeploy(
    project: Project, services: list[str] | tuple[str, ...] | None, hosts: list[str] | tuple[str, ...] | None
) -> list[tuple[Any, list[str]]]:
    """(host, service names) pairs to remove; unknown names raise ConfigError before any host is touched."""
    selected_hosts = project.select_hosts(list(hosts) if hosts else None)
    names = list(services) if services else [s.name for s in project.services]
    known = {s.name: s for s in project.services}
    for name in names:
        if name not in known and not re.fullmatch(SERVICE_NAME_PATTERN, name):
            raise ConfigError(f"--services {name!r}: not a service name (lower-case letters, digits and dashes)")
    pairs = []
    for host in selected_hosts:
        on_host = [n for n in names if n not in known or host in project.hosts_of(known[n])]
        if on_host:
            pairs.append((host, on_host))
    if not pairs:
        raise ConfigError("nothing to undeploy: none of the selected services runs on the selected hosts")
    return pairs


def execute_undeploy(
    project: Project,
    *,
    services: list[str] | tuple[str, ...] | None = None,
    hosts: list[str] | tuple[str, ...] | None = None,
    progress: Callable[[str], None] | None = None,
    run_playbook: Callable[..., Any] = run_playbook,
) -> UndeployReport:
    """Remove the selected services host by host; stops at the first host that fails.

    Args:
        services, hosts: names to restrict it to (None = all); a service no longer in the project may be named.
        progress: called with one-line status messages.
        run_playbook: the Ansible seam.
    Returns:
        an UndeployReport (`ok` False at the first host that failed).
    """
    say = progress or (lambda _msg: None)
    report = UndeployReport(ok=True)
    for host, names in plan_undeploy(project, services, hosts):
        row = HostUndeploy(host=host.name, services=names)
        report.hosts.append(row)
        say(f"{host.name}: removing {', '.join(names)}")
        try:
            result = run_playbook(UNDEPLOY_PLAYBOOK, project, [host], {"ddtree_deploy_rollback_services": names})
        except HostError as err:
            row.error = str(err)
            report.ok = False
            report.failure = f"undeploy failed on host {host.name!r}: {err}"
            break
        outcome = (getattr(result, "hosts", None) or {}).get(host.name)
        row.changed = getattr(outcome, "changed", None)
    return report
