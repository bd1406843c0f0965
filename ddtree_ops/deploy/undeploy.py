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
from dataclasses import dataclass, field
from typing import Any

from ..config import SERVICE_NAME_PATTERN, Project
from ..exceptions import ConfigError, HostError
from ..hosts.ansible import run_playbook
from .outcomes import changed_count, new_deploy_id

UNDEPLOY_PLAYBOOK = "undeploy.yml"


@dataclass
class HostUndeploy:
    host: str
    services: list[str]
    changed: int | None = None  # Ansible tasks changed on the host: 0 means there was nothing to remove
    error: str | None = None

    @property
    def status(self) -> str:
        """removed | nothing to remove | failed | unknown (the runner reported no change count)."""
        if self.error:
            return "failed"
        if self.changed is None:
            return "unknown"
        return "removed" if self.changed else "nothing to remove"


@dataclass
class UndeployReport:
    ok: bool
    hosts: list[HostUndeploy] = field(default_factory=list)
    failure: str | None = None
    operation_id: str = ""

    @property
    def nothing_removed(self) -> bool:
        """True when every host said there was nothing to remove (a second undeploy)."""
        return bool(self.hosts) and all(h.status == "nothing to remove" for h in self.hosts)

    def to_dict(self) -> dict[str, Any]:
        """The `--json` document (schemas/undeploy.json): the common envelope, services as objects.

        A service's `status` is `absent` once its host succeeded (it is gone now, whether this run or
        an earlier one removed it: the host's `status` says which), else the host's status.
        """
        hosts = []
        for h in self.hosts:
            service_status = "absent" if h.status in ("removed", "nothing to remove") else h.status
            hosts.append({
                "host": h.host, "status": h.status, "changed": h.changed, "error": h.error,
                "services": [{"service": name, "status": service_status} for name in h.services],
            })  # fmt: skip
        return {
            "ok": self.ok,
            "operation_id": self.operation_id,
            "changed": any(h.status == "removed" for h in self.hosts),
            "warnings": [],
            "failures": [
                {"host": h.host, "service": None, "message": f"undeploy failed on host {h.host!r}: {h.error}"}
                for h in self.hosts if h.error
            ],
            "hosts": hosts,
        }


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
        an UndeployReport (`ok` False at the first host that failed). A host where the playbook
        changed nothing had nothing to remove (the playbook is idempotent: it only changes a host
        that still has a unit, an env file or a state.json entry of a named service).
    """
    say = progress or (lambda _msg: None)
    report = UndeployReport(ok=True, operation_id="undeploy-" + new_deploy_id())
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
        row.changed = changed_count(result, host.name)
        if row.status == "nothing to remove":
            say(f"{host.name}: nothing to remove ({', '.join(names)} not deployed there)")
    return report
