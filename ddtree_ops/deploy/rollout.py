"""`ddtree-ops deploy`: install releases one host at a time behind a health gate.

`plan.plan_deploy` is pure: it decides which services go to which hosts. `execute_deploy` then runs
`ansible/deploy.yml` for one host, waits on the control node for every service's `/health` and
checks `/server_info` (gate.py), and only then moves to the next host. A host whose gate fails is
rolled back (`ansible/rollback.yml`) and the rollout stops there. Before a host is touched, the ABI
manifest stored beside its engine environment must say the env passed (`env_gate`); otherwise the
rollout stops at that host with the failed checks.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import Project
from ..exceptions import DdtreeOpsError, HostError
from ..hosts.ansible import run_playbook
from ..hosts.layout import STATE_CURRENT, STATE_DEPLOY_ID, STATE_PREVIOUS, STATE_ROLLED_BACK_BY, unit_name
from ..hosts.ssh import SSH, Transport
from ..provision.manifest import read_env_verdict
from ..progress import Progress
from .gate import GateTarget, UnitProbe, wait_healthy, wait_restored
from .outcomes import (
    DeployInterrupted,
    DeployReport,
    HostDeployOutcome,
    ServiceOutcome,
    changed_count,
    failure_entry,
    journal_tail,
    new_deploy_id,
    service_states,
)
from .plan import DeployPlan, HostPlan, ServicePlan

DEPLOY_PLAYBOOK = "deploy.yml"
ROLLBACK_PLAYBOOK = "rollback.yml"
# Returns why a host must not be deployed to (its env failed or lacks its ABI manifest), or None.
EnvGate = Callable[[str], "str | None"]


def stored_manifest_gate(project: Project, transport: Transport = SSH) -> EnvGate:
    """An EnvGate that reads the manifest provision stored beside each host's env (read-only, over SSH).

    Args:
        project: names the hosts and the install mode.
        transport: the SSH seam.
    Returns:
        the gate.
    """

    def gate(host_name: str) -> str | None:
        try:
            return read_env_verdict(project.host(host_name), mode=project.engine.install.mode, transport=transport).refusal()
        except HostError as err:
            return f"host {host_name!r}: cannot read its engine environment's ABI manifest: {err}"

    return gate


def execute_deploy(
    plan: DeployPlan,
    *,
    deploy_id: str | None = None,
    progress: Progress | None = None,
    on_event: Callable[[dict], None] | None = None,
    log_dir: str | Path | None = None,
    run_playbook: Callable[..., Any] = run_playbook,
    unit_probe: UnitProbe | None = None,
    env_gate: EnvGate | None = None,
) -> DeployReport:
    """Roll `plan` out one host at a time behind the health gate.

    Args:
        plan: from `plan_deploy`.
        deploy_id: names new releases and marks what this rollout changed (default: UTC timestamp).
        progress: called with one-line status messages (the CLI prints them to stderr).
        on_event, log_dir: passed to `ansible.run_playbook`.
        run_playbook: the Ansible seam (default `ddtree_ops.hosts.ansible.run_playbook`).
        unit_probe: ends a host's wait early when systemd gave up on a unit
            (`systemd_unit_probe(project)`); None = wait for /health alone.
        env_gate: asked before each host is touched (`stored_manifest_gate(project)`); a refusal
            stops the rollout there, with that host unchanged. None = no check.

    Returns:
        a DeployReport; `ok` is False when a host failed (it was rolled back, and later hosts were
        not touched) and `failure` says which host and service, why, and the journal tail.
    Raises:
        DeployInterrupted: Ctrl-C (a KeyboardInterrupt); its `report` names the host that was being
            deployed as "interrupted" and the later hosts as skipped.
    """
    run = run_playbook
    deploy_id = deploy_id or new_deploy_id()
    say = progress or (lambda _msg: None)
    report = DeployReport(deploy_id=deploy_id, ok=True, hosts=[], warnings=list(plan.warnings))

    for index, host_plan in enumerate(plan.hosts):
        try:
            done = _deploy_host(plan, index, report, run, deploy_id, say, on_event, log_dir, unit_probe, env_gate)
        except KeyboardInterrupt:
            _interrupted(plan, index, report, deploy_id, say)
            raise DeployInterrupted(report) from None
        if done:
            break
    return report


def _interrupted(plan: DeployPlan, index: int, report: DeployReport, deploy_id: str, say: Progress) -> None:
    """Ctrl-C while host `index` was being deployed: say what state it may be in and what converges it."""
    host_plan = plan.hosts[index]
    host = host_plan.host
    if not report.hosts or report.hosts[-1].host != host:
        report.hosts.append(HostDeployOutcome(host=host, status="interrupted"))
    outcome = report.hosts[-1]
    outcome.status = "interrupted"
    for service_outcome in outcome.services:
        if service_outcome.status in ("pending", "healthy", "unchanged"):
            service_outcome.status = "interrupted"
    skipped = plan.hosts[index + 1 :]
    report.hosts += [_skipped_outcome(later) for later in skipped]
    report.ok = False
    why = (
        f"deploy interrupted (Ctrl-C) on host {host!r} (rollout {deploy_id}): its services may run the new "
        "release without a passed health gate; run the same `ddtree-ops deploy` again to converge "
        f"(releases already installed are kept), or `ddtree-ops rollback --hosts {host}`"
    )
    outcome.error = why
    lines = [why]
    if skipped:
        lines.append(f"rollout stopped: host(s) {', '.join(h.host for h in skipped)} were not touched")
    report.failure = "\n".join(lines)
    report.failures = [failure_entry(host, None, why)]
    say(f"{host}: interrupted")


def _deploy_host(
    plan: DeployPlan,
    index: int,
    report: DeployReport,
    run: Callable[..., Any],
    deploy_id: str,
    say: Progress,
    on_event: Callable[[dict], None] | None,
    log_dir: str | Path | None,
    unit_probe: UnitProbe | None,
    env_gate: EnvGate | None,
) -> bool:
    """Deploy one host behind the gate (rolled back when it fails); True when the rollout stops here."""
    settings = plan.project.deploy
    host_plan = plan.hosts[index]
    host = host_plan.host
    refusal = env_gate(host) if env_gate is not None else None
    if refusal:
        say(f"{host}: refused: its engine environment did not pass its ABI manifest")
        report.ok = False
        report.hosts.append(_refused_outcome(host_plan, refusal))
        skipped = plan.hosts[index + 1 :]
        report.hosts += [_skipped_outcome(later) for later in skipped]
        lines = [f"deploy stopped at host {host!r}, which was not changed:", refusal]
        if skipped:
            lines.append(f"rollout stopped: host(s) {', '.join(h.host for h in skipped)} were not touched")
        report.failure = "\n".join(lines)
        report.failures = [failure_entry(host, None, refusal)]
        return True
    with tempfile.TemporaryDirectory(prefix=f"ddtree-deploy-{host}-") as tmp:
        report_dir = Path(tmp)
        extravars = {
            "ddtree_deploy_id": deploy_id,
            "ddtree_deploy_runtime": plan.project.engine.install.mode,
            "ddtree_deploy_services": [s.spec.as_vars() for s in host_plan.services],
            "ddtree_deploy_report_dir": str(report_dir),
            "ddtree_deploy_api_key_line": plan.api_key_line,
        }
        # Not "installing": a service whose rendered release is already current is left alone.
        say(f"{host}: deploying {', '.join(s.service for s in host_plan.services)} (rollout {deploy_id})")
        outcome = HostDeployOutcome(host=host, status="deployed")
        report.hosts.append(outcome)
        playbook_error: str | None = None
        try:
            result = run(
                DEPLOY_PLAYBOOK, plan.project, [plan.project.host(host)], extravars,
                on_event=on_event, log_dir=log_dir,
            )  # fmt: skip
            outcome.changed = changed_count(result, host)
        except HostError as err:
            playbook_error = str(err)

        state = service_states(report_dir, host)
        for s in host_plan.services:
            entry = state.get(s.service) or {}
            outcome.services.append(
                _service_outcome(
                    s,
                    "not deployed" if playbook_error else "pending",
                    release_id=entry.get(STATE_CURRENT),
                    previous_release_id=entry.get(STATE_PREVIOUS),
                    release_changed=entry.get(STATE_DEPLOY_ID) == deploy_id,
                )
            )

        failed: list[tuple[ServiceOutcome, str]] = []
        if playbook_error:
            # Ansible's message names the failing task, and the task names name the service.
            failed = [(s, "not deployed: the deploy playbook failed (below)") for s in outcome.services]
        else:
            changed = [o.service for o in outcome.services if o.release_changed]
            say(_changed_line(host, outcome.services, changed))
            say(f"{host}: waiting up to {settings.health_timeout_s:g}s for /health of each service")
            gate = wait_healthy(
                [s.gate_target() for s in host_plan.services],
                timeout_s=settings.health_timeout_s,
                interval_s=settings.health_interval_s,
                # "healthy after 0.0s" of a service nobody restarted says nothing: only changed ones speak.
                progress=lambda line: say(line) if any(f"/{n}:" in line for n in changed) else None,
                unit_probe=unit_probe,
            )
            for service_outcome in outcome.services:
                result_for = gate[service_outcome.service]
                service_outcome.healthy_after_s = result_for.healthy_after_s
                if result_for.healthy:
                    service_outcome.status = "healthy" if service_outcome.release_changed else "unchanged"
                else:
                    service_outcome.status = "mismatch" if result_for.healthy_after_s is not None else "unhealthy"
                    service_outcome.detail = result_for.reason
                    failed.append((service_outcome, result_for.reason))
            if not changed and not failed:
                say(f"{host}: up to date, nothing changed; {_settings_line(outcome.services)} healthy")

        if not failed:
            return False

        outcome.status = "failed"
        outcome.error = playbook_error or "; ".join(f"{s.service}: {reason}" for s, reason in failed)
        report.ok = False
        say(f"{host}: gate failed; rolling back what rollout {deploy_id} changed")
        journals, rollback_note = _rollback_after_failure(
            run, plan, host_plan, outcome, deploy_id, [s.service for s, _ in failed], on_event, log_dir, say,
            unit_probe,
        )  # fmt: skip
        skipped = plan.hosts[index + 1 :]
        report.hosts += [_skipped_outcome(later) for later in skipped]
        report.failure = _failure_message(host, failed, journals, playbook_error, rollback_note, skipped)
        report.failures = [
            failure_entry(host, s.service, _with_journal(reason, journals.get(s.service))) for s, reason in failed
        ]
        if playbook_error:
            report.failures.append(failure_entry(host, None, f"the deploy playbook failed: {playbook_error}"))
        return True


def _service_outcome(plan: ServicePlan, status: str, **fields: Any) -> ServiceOutcome:
    """A service's outcome, carrying the settings this rollout deploys (shown in the table and JSON)."""
    return ServiceOutcome(
        host=plan.host, service=plan.service, port=plan.port, status=status, algorithm=plan.algorithm,
        budget=plan.budget, topk=plan.topk, block_size=plan.block_size, **fields,
    )  # fmt: skip


def _settings_line(services: list[ServiceOutcome]) -> str:
    """`baseline (dflash block 16), tree (ddtree budget 15, topk 8, block 16)`."""
    return ", ".join(f"{s.service} ({s.settings()})" for s in services)


def _changed_line(host: str, services: list[ServiceOutcome], changed: list[str]) -> str:
    if not changed:
        return f"{host}: every release is already installed ({_settings_line(services)}); checking health"
    unchanged = [s.service for s in services if s.service not in changed]
    rest = f"; {', '.join(unchanged)} unchanged" if unchanged else ""
    installed = _settings_line([s for s in services if s.service in changed])
    return f"{host}: installed new releases of {installed}{rest}"


def _with_journal(reason: str, journal: str | None) -> str:
    return f"{reason}\nlast journal lines:\n{journal}" if journal else reason


def _refused_outcome(host_plan: HostPlan, refusal: str) -> HostDeployOutcome:
    return HostDeployOutcome(
        host=host_plan.host,
        status="refused",
        error=refusal,
        services=[
            _service_outcome(s, "not deployed", detail="its engine environment failed or lacks its ABI manifest")
            for s in host_plan.services
        ],
    )


def _skipped_outcome(host_plan: HostPlan) -> HostDeployOutcome:
    return HostDeployOutcome(
        host=host_plan.host, status="skipped", services=[_service_outcome(s, "skipped") for s in host_plan.services]
    )


def _failure_message(
    host: str,
    failed: list[tuple[ServiceOutcome, str]],
    journals: dict[str, str],
    playbook_error: str | None,
    rollback_note: str,
    skipped: list[HostPlan],
) -> str:
    lines = [f"deploy failed on host {host!r}:"]
    for service_outcome, reason in failed:
        unit = unit_name(service_outcome.service)
        lines.append(f"  service {service_outcome.service!r} ({unit}): {reason}")
        journal = journals.get(service_outcome.service)
        if journal:
            lines.append(f"  last journal lines of {unit}:")
            lines += [f"    {line}" for line in journal.splitlines()]
    if playbook_error:
        lines.append(f"  the deploy playbook failed: {playbook_error}")
    lines.append(f"  {rollback_note}")
    if skipped:
        lines.append(f"  rollout stopped: host(s) {', '.join(h.host for h in skipped)} were not touched")
    return "\n".join(lines)


def _rollback_after_failure(
    run: Callable[..., Any],
    plan: DeployPlan,
    host_plan: HostPlan,
    outcome: HostDeployOutcome,
    deploy_id: str,
    failed_services: list[str],
    on_event: Callable[[dict], None] | None,
    log_dir: str | Path | None,
    say: Progress,
    unit_probe: UnitProbe | None,
) -> tuple[dict[str, str], str]:
    """Roll back what `deploy_id` changed on one host; returns (journal tails, a one-line note)."""
    host = host_plan.host
    with tempfile.TemporaryDirectory(prefix=f"ddtree-rollback-{host}-") as tmp:
        report_dir = Path(tmp)
        extravars = {
            "ddtree_deploy_id": deploy_id,
            "ddtree_deploy_rollback_deploy_id": deploy_id,
            "ddtree_deploy_journal_dir": str(report_dir),
            "ddtree_deploy_journal_services": failed_services,
            "ddtree_deploy_report_dir": str(report_dir),
        }
        try:
            run(
                ROLLBACK_PLAYBOOK, plan.project, [plan.project.host(host)], extravars,
                on_event=on_event, log_dir=log_dir,
            )  # fmt: skip
        except DdtreeOpsError as err:
            outcome.status = "failed"
            journals = {s: journal_tail(report_dir, host, s) for s in failed_services}
            when = f"when {host} answers again" if "unreachable" in str(err) else "once that is fixed"
            return journals, (
                f"rollback of {host!r} FAILED too: {err}\n  {when}, its services may run the new release: "
                f"run the same `ddtree-ops deploy` again to converge, or `ddtree-ops rollback --hosts {host}`"
            )
        journals = {s: journal_tail(report_dir, host, s) for s in failed_services}
        state = service_states(report_dir, host)

    outcome.status = "rolled back"
    restored: list[GateTarget] = []
    notes = []
    for service_outcome, service_plan in zip(outcome.services, host_plan.services):
        entry = state.get(service_outcome.service) or {}
        if entry.get(STATE_ROLLED_BACK_BY) != deploy_id:
            continue  # this rollout had not changed it: left as it was
        if entry.get(STATE_CURRENT):
            service_outcome.status = "rolled back"
            service_outcome.release_id = entry[STATE_CURRENT]
            restored.append(service_plan.gate_target())
            notes.append(f"{service_outcome.service} → {entry[STATE_CURRENT]}")
        else:
            service_outcome.status = "stopped"
            service_outcome.release_id = None
            notes.append(f"{service_outcome.service} stopped and disabled (it had no previous release)")
    if not notes:
        return journals, f"host {host!r}: nothing to roll back (rollout {deploy_id} had changed no service there)"

    # The old release must come back healthy, or the operator needs to know it did not.
    if restored:
        gate = wait_restored(restored, plan.project.deploy, say, unit_probe)
        for service_outcome in outcome.services:
            result = gate.get(service_outcome.service)
            if result is None:
                continue
            if result.healthy:
                service_outcome.healthy_after_s = result.healthy_after_s
            else:
                notes.append(f"{service_outcome.service} is NOT healthy on its previous release: {result.reason}")
    return journals, f"host {host!r} rolled back: " + "; ".join(notes)
