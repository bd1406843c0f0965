"""`ddtree-ops deploy` and `rollback`: install releases one host at a time behind a health gate.

`plan_deploy` is pure: it validates the command line against the project file (ConfigError,
exit 2, before any host is touched) and decides which services go to which hosts.
`execute_deploy` then runs `ansible/deploy.yml` for one host, waits on the control node for
every service's `/health` and checks `/server_info`, and only then moves to the next host.
A host whose gate fails is rolled back (`ansible/rollback.yml`) and the rollout stops there.
Before a host is touched, the ABI manifest stored beside its engine environment must say the env
passed (`env_gate`); otherwise the rollout stops at that host with the failed checks.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

from .config import Project, Service
from .exceptions import ConfigError, DdtreeOpsError, HostError
from . import server_info
from .units import UnitSpec, unit_name, unit_spec

DEPLOY_PLAYBOOK = "deploy.yml"
ROLLBACK_PLAYBOOK = "rollback.yml"
JOURNAL_TAIL_LINES = 12
OWN_JOURNAL_LINES = 4

Progress = Callable[[str], None]
# Returns why systemd gave up on a service's unit (e.g. "unit ddtree-tree.service failed after
# 5 restarts"), or None while it is still starting, running or about to restart.
UnitProbe = Callable[["ServicePlan"], "str | None"]
UNIT_PROBE_INTERVAL_S = 5.0
# Returns why a host must not be deployed to (its env failed or lacks its ABI manifest), or None.
EnvGate = Callable[[str], "str | None"]


@dataclass(frozen=True)
class ServicePlan:
    """One service on one host: where to probe it and what it must report."""

    host: str
    address: str
    service: str
    port: int
    algorithm: str
    budget: int | None
    topk: int | None
    spec: UnitSpec
    block_size: int | None = None  # what /server_info must report for dflash/ddtree

    @property
    def base_url(self) -> str:
        address = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{address}:{self.port}"


@dataclass(frozen=True)
class HostPlan:
    host: str
    address: str
    services: list[ServicePlan]


@dataclass(frozen=True)
class DeployPlan:
    """What a deploy will do, before it touches anything."""

    project: Project  # with the command-line overrides applied
    hosts: list[HostPlan]
    warnings: list[str] = field(default_factory=list)


@dataclass
class ServiceOutcome:
    host: str
    service: str
    port: int
    # healthy | unhealthy | mismatch | rolled back | stopped | not deployed | skipped
    status: str
    release_id: str | None = None
    previous_release_id: str | None = None
    release_changed: bool = False
    healthy_after_s: float | None = None
    detail: str = ""


@dataclass
class HostDeployOutcome:
    host: str
    status: str  # deployed | rolled back | failed | refused (env failed its manifest) | skipped
    changed: int | None = None  # Ansible tasks changed on the host by the deploy playbook
    services: list[ServiceOutcome] = field(default_factory=list)
    error: str | None = None


@dataclass
class DeployReport:
    deploy_id: str
    ok: bool
    hosts: list[HostDeployOutcome]
    warnings: list[str] = field(default_factory=list)
    failure: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- planning (pure) -------------------------------------------------------------------------


def _select_services(project: Project, names: list[str] | tuple[str, ...] | None) -> list[Service]:
    if not names:
        return list(project.services)
    for name in names:
        project.service(name)  # raises ConfigError naming the known services
    return [s for s in project.services if s.name in names]


def _width_warning(service: Service, block_size: int) -> str | None:
    width = service.budget + 1
    if width == block_size:
        return None
    return (
        f"service {service.name!r}: tree verify width budget+1 = {width} differs from block size {block_size}: "
        f"the linear baseline verifies {block_size} tokens per step and the tree {width}, so the tree costs a "
        f"different verify width than the linear baseline, so the comparison is not at equal cost "
        f"(use --budget {block_size - 1} for equal cost)"
    )


def plan_deploy(
    project: Project,
    *,
    budget: int | None = None,
    topk: int | None = None,
    services: list[str] | tuple[str, ...] | None = None,
    hosts: list[str] | tuple[str, ...] | None = None,
    api_key: str | None = None,
) -> DeployPlan:
    """Decide which services go to which hosts, with `budget`/`topk` overriding the ddtree services.

    Args:
        project: the validated project file.
        budget, topk: overrides for every selected `ddtree` service (None = keep the file's).
        services, hosts: names to restrict the deploy to (None/empty = all).
        api_key: written to each service's env file as DDTREE_API_KEY (None = no key).

    Returns a DeployPlan with warnings. Raises ConfigError for unknown names, budget < 0,
    topk < 1, or overrides that apply to no selected service — before any host is touched.
    """
    if budget is not None and budget < 0:
        raise ConfigError(f"--budget {budget}: the tree budget must be >= 0 (0 verifies the root alone)")
    if topk is not None and topk < 1:
        raise ConfigError(f"--topk {topk}: topk must be >= 1")
    selected_hosts = project.select_hosts(list(hosts) if hosts else None)
    selected = _select_services(project, services)

    overrides = {k: v for k, v in (("budget", budget), ("topk", topk)) if v is not None}
    if overrides and not any(s.algorithm == "ddtree" for s in selected):
        flags = " and ".join(f"--{k}" for k in overrides)
        raise ConfigError(
            f"{flags} override the ddtree service(s), but none is selected "
            f"(selected: {', '.join(s.name for s in selected)}): select a service with algorithm 'ddtree'"
        )
    overridden = {s.name: s.model_copy(update=overrides) if s.algorithm == "ddtree" else s for s in selected}
    project = project.model_copy(update={"services": [overridden.get(s.name, s) for s in project.services]})

    warnings: list[str] = []
    for service in overridden.values():
        if service.algorithm != "ddtree":
            continue
        warning = _width_warning(service, project.engine.block_size)
        if warning:
            warnings.append(warning)
        if service.topk > max(service.budget, 1):
            warnings.append(
                f"service {service.name!r}: topk {service.topk} > budget {service.budget}: "
                f"at most {max(service.budget, 1)} candidates per depth can be used"
            )

    host_plans: list[HostPlan] = []
    for host in selected_hosts:
        plans = [
            ServicePlan(
                host=host.name,
                address=host.address,
                service=service.name,
                port=service.port,
                algorithm=service.algorithm,
                budget=service.budget,
                topk=service.topk,
                block_size=project.engine.block_size,
                spec=unit_spec(
                    service,
                    host,
                    project.engine,
                    metrics_log_interval=project.deploy.metrics_log_interval,
                    api_key=api_key,
                ),
            )
            for service in overridden.values()
            if host in project.hosts_of(service)
        ]
        if plans:
            host_plans.append(HostPlan(host=host.name, address=host.address, services=plans))
    if not host_plans:
        raise ConfigError(
            f"nothing to deploy: none of the selected services ({', '.join(overridden)}) runs on the selected "
            f"hosts ({', '.join(h.name for h in selected_hosts)}); check services[].hosts"
        )
    return DeployPlan(project=project, hosts=host_plans, warnings=warnings)


# --- the health gate -------------------------------------------------------------------------


@dataclass
class GateResult:
    healthy: bool
    healthy_after_s: float | None
    reason: str = ""


def expected_server_info(plan: ServicePlan) -> dict[str, Any]:
    return server_info.expected(plan.algorithm, plan.block_size, plan.budget, plan.topk)


def server_info_mismatches(info: dict[str, Any], plan: ServicePlan) -> list[str]:
    """Differences between `/server_info` and what was deployed, as `key: server says X, deployed Y`."""
    return server_info.mismatches(expected_server_info(plan), info)


def wait_healthy(
    services: list[ServicePlan],
    *,
    timeout_s: float,
    interval_s: float,
    progress: Progress | None = None,
    check_info: bool = True,
    unit_probe: UnitProbe | None = None,
    client: httpx.Client | None = None,
) -> dict[str, GateResult]:
    """Poll every service's `/health` until it answers 200 or `timeout_s` passes, then check `/server_info`.

    `check_info=False` skips the `/server_info` comparison (a previous release restored by a
    rollback may carry other settings than the plan). `unit_probe`, when given, is asked every
    UNIT_PROBE_INTERVAL_S for the unit's state: a unit systemd gave up on (start limit hit)
    fails at once instead of after the whole timeout.

    Returns one GateResult per service name. All services of a host are polled together, so a
    host costs one timeout at most.
    """
    own_client = client is None
    client = client or httpx.Client(timeout=min(10.0, max(interval_s, 2.0)))
    start = time.monotonic()
    results: dict[str, GateResult] = {}
    last_seen: dict[str, str] = {s.service: "no answer yet" for s in services}
    pending = list(services)
    next_unit_probe = start + UNIT_PROBE_INTERVAL_S
    try:
        while pending:
            for plan in list(pending):
                try:
                    response = client.get(f"{plan.base_url}/health")
                    last_seen[plan.service] = f"/health answered {response.status_code}"
                    if response.status_code == 200:
                        results[plan.service] = GateResult(True, round(time.monotonic() - start, 1))
                        pending.remove(plan)
                        if progress:
                            progress(
                                f"{plan.host}/{plan.service}: healthy after {results[plan.service].healthy_after_s}s"
                            )
                except httpx.HTTPError as err:
                    last_seen[plan.service] = f"/health: {type(err).__name__}: {err}"
            if not pending:
                break
            if unit_probe is not None and time.monotonic() >= next_unit_probe:
                next_unit_probe = time.monotonic() + UNIT_PROBE_INTERVAL_S
                for plan in list(pending):
                    given_up = unit_probe(plan)
                    if given_up:
                        results[plan.service] = GateResult(
                            False, None, f"{given_up} before /health answered 200 (last: {last_seen[plan.service]})"
                        )
                        pending.remove(plan)
                if not pending:
                    break
            if time.monotonic() - start >= timeout_s:
                for plan in pending:
                    results[plan.service] = GateResult(
                        False,
                        None,
                        f"/health at {plan.base_url} did not answer 200 within {timeout_s:g}s "
                        f"(last: {last_seen[plan.service]})",
                    )
                break
            time.sleep(interval_s)

        for plan in services if check_info else []:
            if not results[plan.service].healthy:
                continue
            try:
                info = client.get(f"{plan.base_url}/server_info").json()
                if not isinstance(info, dict):
                    raise ValueError(f"expected a JSON object, got {type(info).__name__}")
            except (httpx.HTTPError, ValueError) as err:
                results[plan.service] = GateResult(False, None, f"/server_info failed: {err}")
                continue
            problems = server_info_mismatches(info, plan)
            if problems:
                results[plan.service] = GateResult(
                    False,
                    results[plan.service].healthy_after_s,
                    "/server_info does not match the deploy: " + "; ".join(problems),
                )
    finally:
        if own_client:
            client.close()
    return results


# --- execution ---------------------------------------------------------------------------------


def systemd_unit_probe(project: Project) -> UnitProbe:
    """A UnitProbe that asks the host's systemd over SSH (read-only); SSH trouble counts as 'no verdict'."""
    from .remote import ssh_run

    def probe(plan: ServicePlan) -> str | None:
        unit = unit_name(plan.service)
        try:
            text = ssh_run(
                project.host(plan.host), f"systemctl show -p ActiveState -p SubState -p NRestarts {unit}", timeout_s=20
            )
        except DdtreeOpsError:
            return None
        props = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        state, sub = props.get("ActiveState"), props.get("SubState")
        # Between crash and restart the unit is activating/auto-restart: still worth waiting for.
        if state == "failed" or (state == "inactive" and sub == "dead"):
            return f"systemd gave up on {unit} ({state}/{sub} after {props.get('NRestarts', '?')} restarts)"
        return None

    return probe


def stored_manifest_gate(project: Project) -> EnvGate:
    """An EnvGate that reads the manifest provision stored beside each host's env (read-only, over SSH)."""
    from .manifest import read_env_verdict

    def gate(host_name: str) -> str | None:
        try:
            return read_env_verdict(project.host(host_name), mode=project.engine.install.mode).refusal()
        except HostError as err:
            return f"host {host_name!r}: cannot read its engine environment's ABI manifest: {err}"

    return gate


def _default_runner():
    from .ansible import run_playbook

    return run_playbook


def new_deploy_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _read_state(report_dir: Path, host: str) -> dict[str, Any]:
    path = report_dir / f"{host}.state.json"
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def _journal_tail(report_dir: Path, host: str, service: str, lines: int = JOURNAL_TAIL_LINES) -> str:
    path = report_dir / f"{host}-{service}.journal"
    if not path.exists():
        return ""
    all_lines = [line for line in path.read_text().splitlines() if line.strip()]
    # systemd's own restart chatter can fill the tail; the service's last words say why it died.
    own = [i for i, line in enumerate(all_lines) if f" ddtree-{service}[" in line][-OWN_JOURNAL_LINES:]
    keep = sorted(set(range(max(0, len(all_lines) - lines), len(all_lines))) | set(own))
    return "\n".join(all_lines[i] for i in keep)


def _changed_count(result: Any, host: str) -> int | None:
    outcome = (getattr(result, "hosts", None) or {}).get(host)
    return getattr(outcome, "changed", None) if outcome is not None else None


def execute_deploy(
    plan: DeployPlan,
    *,
    deploy_id: str | None = None,
    progress: Progress | None = None,
    on_event: Callable[[dict], None] | None = None,
    log_dir: str | Path | None = None,
    run_playbook: Callable[..., Any] | None = None,
    unit_probe: UnitProbe | None = None,
    env_gate: EnvGate | None = None,
) -> DeployReport:
    """Roll `plan` out one host at a time behind the health gate.

    Args:
        plan: from `plan_deploy`.
        deploy_id: names new releases and marks what this rollout changed (default: UTC timestamp).
        progress: called with one-line status messages (the CLI prints them to stderr).
        on_event, log_dir: passed to `ansible.run_playbook`.
        run_playbook: the Ansible seam (default `ddtree_ops.ansible.run_playbook`).
        unit_probe: ends a host's wait early when systemd gave up on a unit
            (`systemd_unit_probe(project)`); None = wait for /health alone.
        env_gate: asked before each host is touched (`stored_manifest_gate(project)`); a refusal
            stops the rollout there, with that host unchanged. None = no check.

    Returns a DeployReport; `ok` is False when a host failed (it was rolled back, and later
    hosts were not touched) and `failure` says which host and service, why, and the journal tail.
    """
    run = run_playbook or _default_runner()
    deploy_id = deploy_id or new_deploy_id()
    settings = plan.project.deploy
    say = progress or (lambda _msg: None)
    report = DeployReport(deploy_id=deploy_id, ok=True, hosts=[], warnings=list(plan.warnings))

    for index, host_plan in enumerate(plan.hosts):
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
            break
        with tempfile.TemporaryDirectory(prefix=f"ddtree-deploy-{host}-") as tmp:
            report_dir = Path(tmp)
            extravars = {
                "ddtree_deploy_id": deploy_id,
                "ddtree_deploy_runtime": plan.project.engine.install.mode,
                "ddtree_deploy_services": [s.spec.as_vars() for s in host_plan.services],
                "ddtree_deploy_report_dir": str(report_dir),
            }
            say(f"{host}: installing {', '.join(s.service for s in host_plan.services)} (rollout {deploy_id})")
            outcome = HostDeployOutcome(host=host, status="deployed")
            report.hosts.append(outcome)
            playbook_error: str | None = None
            try:
                result = run(
                    DEPLOY_PLAYBOOK, plan.project, [plan.project.host(host)], extravars,
                    on_event=on_event, log_dir=log_dir,
                )  # fmt: skip
                outcome.changed = _changed_count(result, host)
            except HostError as err:
                playbook_error = str(err)

            state = _read_state(report_dir, host).get("services") or {}
            for s in host_plan.services:
                entry = state.get(s.service) or {}
                outcome.services.append(
                    ServiceOutcome(
                        host=host,
                        service=s.service,
                        port=s.port,
                        status="not deployed" if playbook_error else "pending",
                        release_id=entry.get("current"),
                        previous_release_id=entry.get("previous"),
                        release_changed=entry.get("deploy_id") == deploy_id,
                    )
                )

            failed: list[tuple[ServiceOutcome, str]] = []
            if playbook_error:
                # Ansible's message names the failing task, and the task names name the service.
                failed = [(s, "not deployed: the deploy playbook failed (below)") for s in outcome.services]
            else:
                say(f"{host}: waiting up to {settings.health_timeout_s:g}s for /health of each service")
                gate = wait_healthy(
                    host_plan.services,
                    timeout_s=settings.health_timeout_s,
                    interval_s=settings.health_interval_s,
                    progress=say,
                    unit_probe=unit_probe,
                )
                for service_outcome in outcome.services:
                    result_for = gate[service_outcome.service]
                    service_outcome.healthy_after_s = result_for.healthy_after_s
                    if result_for.healthy:
                        service_outcome.status = "healthy"
                    else:
                        service_outcome.status = "mismatch" if result_for.healthy_after_s is not None else "unhealthy"
                        service_outcome.detail = result_for.reason
                        failed.append((service_outcome, result_for.reason))

            if not failed:
                continue

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
            break
    return report


def _refused_outcome(host_plan: HostPlan, refusal: str) -> HostDeployOutcome:
    return HostDeployOutcome(
        host=host_plan.host,
        status="refused",
        error=refusal,
        services=[
            ServiceOutcome(
                host=host_plan.host,
                service=s.service,
                port=s.port,
                status="not deployed",
                detail="its engine environment failed or lacks its ABI manifest",
            )
            for s in host_plan.services
        ],
    )


def _skipped_outcome(host_plan: HostPlan) -> HostDeployOutcome:
    return HostDeployOutcome(
        host=host_plan.host,
        status="skipped",
        services=[
            ServiceOutcome(host=host_plan.host, service=s.service, port=s.port, status="skipped")
            for s in host_plan.services
        ],
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
            journals = {s: _journal_tail(report_dir, host, s) for s in failed_services}
            return journals, f"rollback of {host!r} FAILED too: {err}"
        journals = {s: _journal_tail(report_dir, host, s) for s in failed_services}
        state = _read_state(report_dir, host).get("services") or {}

    outcome.status = "rolled back"
    restored: list[ServicePlan] = []
    notes = []
    for service_outcome, service_plan in zip(outcome.services, host_plan.services):
        entry = state.get(service_outcome.service) or {}
        if entry.get("rolled_back_by") != deploy_id:
            continue  # this rollout had not changed it: left as it was
        if entry.get("current"):
            service_outcome.status = "rolled back"
            service_outcome.release_id = entry["current"]
            restored.append(service_plan)
            notes.append(f"{service_outcome.service} → {entry['current']}")
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


# --- rollback by hand --------------------------------------------------------------------------


@dataclass
class RollbackReport:
    rollback_id: str
    ok: bool
    hosts: list[HostDeployOutcome]
    failure: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def execute_rollback(
    project: Project,
    *,
    services: list[str] | tuple[str, ...] | None = None,
    hosts: list[str] | tuple[str, ...] | None = None,
    progress: Progress | None = None,
    on_event: Callable[[dict], None] | None = None,
    log_dir: str | Path | None = None,
    run_playbook: Callable[..., Any] | None = None,
    unit_probe: UnitProbe | None = None,
) -> RollbackReport:
    """Point services back at their previous release and restart them, one host at a time.

    Services without a previous release are left as they are. Each restored service must pass
    the same health gate as a deploy. Raises ConfigError for unknown names (nothing touched).
    """
    selected_hosts = project.select_hosts(list(hosts) if hosts else None)
    selected = _select_services(project, services)
    run = run_playbook or _default_runner()
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
                outcome.changed = _changed_count(result, host.name)
            except HostError as err:
                outcome.status = "failed"
                outcome.error = str(err)
                report.ok = False
                report.failure = f"rollback failed on host {host.name!r}: {err}"
                break
            state = _read_state(report_dir, host.name).get("services") or {}

        restored: list[ServicePlan] = []
        for service in on_host:
            entry = state.get(service.name) or {}
            rolled = entry.get("rolled_back_by") == rollback_id
            service_outcome = ServiceOutcome(
                host=host.name,
                service=service.name,
                port=service.port,
                status="rolled back" if rolled else "unchanged",
                release_id=entry.get("current"),
                detail="" if rolled else "no previous release to go back to",
            )
            outcome.services.append(service_outcome)
            if rolled:
                outcome.status = "rolled back"
                restored.append(_service_plan(service, host.name, host.address))
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
        if not report.ok:
            break
    return report


def wait_restored(
    restored: list[ServicePlan], settings, say: Progress | None, unit_probe: UnitProbe | None
) -> dict[str, GateResult]:
    """Health of services put back on an older release: /health only, since their
    /server_info is the old release's, not this rollout's."""
    return wait_healthy(
        restored,
        timeout_s=settings.health_timeout_s,
        interval_s=settings.health_interval_s,
        progress=say,
        check_info=False,
        unit_probe=unit_probe,
    )


def _service_plan(service: Service, host: str, address: str) -> ServicePlan:
    spec = UnitSpec(
        service=service.name,
        algorithm=service.algorithm,
        port=service.port,
        budget=service.budget,
        topk=service.topk,
        serve_args=[],
    )
    return ServicePlan(
        host=host,
        address=address,
        service=service.name,
        port=service.port,
        algorithm=service.algorithm,
        budget=service.budget,
        topk=service.topk,
        spec=spec,
    )
