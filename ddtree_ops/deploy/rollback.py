"""`ddtree-ops rollback`: point services back at their previous release and restart them, one host
at a time, each behind the health gate (which needs no deploy plan: a GateTarget is enough)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import Project
from ..exceptions import HostError
from ..hosts.ansible import run_playbook
from ..hosts.layout import STATE_CURRENT, STATE_ROLLED_BACK_BY
from ..service.client import base_url
from ..progress import Progress
from .gate import GateTarget, UnitProbe, wait_restored
from .outcomes import (
    HostDeployOutcome,
    RollbackReport,
    ServiceOutcome,
    changed_count,
    failure_entry,
    new_deploy_id,
    service_states,
)
from .plan import select_services
from .rollout import ROLLBACK_PLAYBOOK

# state.json: the release a rollback moved away from (written by the role's rollback_service.yml).
STATE_ROLLED_BACK_FROM = "rolled_back_from"


def execute_rollback(
    project: Project,
    *,
    services: list[str] | tuple[str, ...] | None = None,
    hosts: list[str] | tuple[str, ...] | None = None,
    progress: Progress | None = None,
    on_event: Callable[[dict], None] | None = None,
    log_dir: str | Path | None = None,
    run_playbook: Callable[..., Any] = run_playbook,
    unit_probe: UnitProbe | None = None,
) -> RollbackReport:
    """Point services back at their previous release and restart them, one host at a time.

    Services without a previous release (or not deployed at all) are left as they are: when that
    is every selected service, the report fails (`ok` False, exit 1) saying so per service; when
    some were rolled back, the others are warnings. Each restored service must pass the same
    health gate as a deploy (/health only: the old release reports its own settings).

    Args:
        services, hosts: names to restrict the rollback to (None = all).
        progress, on_event, log_dir, run_playbook, unit_probe: as for `execute_deploy`.
    Returns:
        a RollbackReport; `ok` is False when a host failed or a restored service is not healthy.
    Raises:
        ConfigError: unknown names (nothing touched).
    """
    selected_hosts = project.select_hosts(list(hosts) if hosts else None)
    selected = select_services(project, services)
    run = run_playbook
    say = progress or (lambda _msg: None)
    rollback_id = "rollback-" + new_deploy_id()
    report = RollbackReport(rollback_id=rollback_id, ok=True, hosts=[])

    for host in selected_hosts:
        on_host = [s for s in selected if host in project.hosts_of(s)]
        if not on_host:
            continue
        outcome = HostDeployOutcome(host=host.name, status="unchanged")
        report.hosts.append(outcome)
        with tempfile.TemporaryDirectory(prefix=f"ddtree-rollback-{host.name}-") as tmp:
            report_dir = Path(tmp)
            extravars = {
                "ddtree_deploy_id": rollback_id,
                "ddtree_deploy_rollback_services": [s.name for s in on_host],
                "ddtree_deploy_report_dir": str(report_dir),
            }
            say(f"{host.name}: rolling back {', '.join(s.name for s in on_host)}")
            try:
                result = run(ROLLBACK_PLAYBOOK, project, [host], extravars, on_event=on_event, log_dir=log_dir)
                outcome.changed = changed_count(result, host.name)
            except HostError as err:
                outcome.status = "failed"
                outcome.error = str(err)
                report.ok = False
                report.failure = f"rollback failed on host {host.name!r}: {err}"
                report.failures = [failure_entry(host.name, None, report.failure)]
                break
            state = service_states(report_dir, host.name)

        restored: list[GateTarget] = []
        for service in on_host:
            entry = state.get(service.name) or {}
            rolled = entry.get(STATE_ROLLED_BACK_BY) == rollback_id
            service_outcome = ServiceOutcome(
                host=host.name,
                service=service.name,
                port=service.port,
                status="rolled back" if rolled else _why_not(entry),
                release_id=entry.get(STATE_CURRENT),
                # A rollback that took effect puts another release in place: that is a change.
                release_changed=rolled,
                previous_release_id=entry.get(STATE_ROLLED_BACK_FROM) if rolled else None,
            )
            outcome.services.append(service_outcome)
            if rolled:
                outcome.status = "rolled back"
                restored.append(
                    GateTarget(host.name, service.name, base_url(host.address, service.port), None, project.engine.backend)
                )
            else:
                service_outcome.detail = f"nothing to roll back: {service.name} on {host.name} {_why_not_sentence(entry)}"
        if restored:
            gate = wait_restored(restored, project.deploy, say, unit_probe)
            for service_outcome in outcome.services:
                result = gate.get(service_outcome.service)
                if result is None:
                    continue
                service_outcome.healthy_after_s = result.healthy_after_s
                if not result.healthy:
                    service_outcome.status = "unhealthy"
                    service_outcome.detail = result.reason
                    report.ok = False
                    report.failure = (
                        f"host {host.name!r}: service {service_outcome.service!r} is not healthy after the "
                        f"rollback: {result.reason}"
                    )
                    report.failures.append(failure_entry(host.name, service_outcome.service, report.failure))
        if not report.ok:
            break
    _judge_nothing_rolled_back(report)
    return report


def _why_not(entry: dict) -> str:
    # After `undeploy` the service has no entry in state.json at all: it is not deployed, which is
    # a different fix (deploy it) from a deployed service that has no older release to go back to.
    return "no previous release" if entry.get(STATE_CURRENT) else "not deployed"


def _why_not_sentence(entry: dict) -> str:
    return {"no previous release": "has no previous release", "not deployed": "is not deployed"}[_why_not(entry)]


def _judge_nothing_rolled_back(report: RollbackReport) -> None:
    """Nothing rolled back anywhere fails (exit 1) naming each service and why; a partial rollback
    succeeds with a warning per service left as it was."""
    if not report.ok:
        return
    left = [s for h in report.hosts for s in h.services if s.status != "rolled back"]
    if not left:
        return
    if any(s.status == "rolled back" for h in report.hosts for s in h.services):
        report.warnings += [s.detail for s in left]
        return
    report.ok = False
    report.failures = [failure_entry(s.host, s.service, s.detail) for s in left]
    report.failure = "\n".join(s.detail for s in left)
