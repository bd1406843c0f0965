"""`provision --plan`: the lock each host would get (or why it would be refused), changing nothing.

Facts come from a live probe over SSH or from a recorded probe file, so an operator can plan for a
host they cannot reach yet. Different hosts may get different locks; `render_side_by_side` shows them
in one table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..config import Host, Project
from ..exceptions import ConfigError, HostError
from ..hosts.probe import HostFacts, load_facts, probe_host, probe_in_parallel
from ..hosts.ssh import SSH, Transport
from ..progress import Progress, silent
from .kinds import attention_backend_for, engine_release, lock_kind
from .lock import EngineLock
from .resolve import Refusal

__all__ = ["attention_backend_for", "engine_release", "load_facts"]  # re-exported for callers of the plan


@dataclass(frozen=True)
class PlanResult:
    host: str
    facts_source: str  # "probe over SSH" | the facts file's path
    facts: HostFacts | None
    lock: EngineLock | None
    refusal: Refusal | None
    error: str | None = None  # the probe itself failed (unreachable host)

    @property
    def ok(self) -> bool:
        return self.lock is not None

    def to_dict(self) -> dict:
        return {
            "host": self.host,
            "facts_source": self.facts_source,
            "ok": self.ok,
            "lock": self.lock.to_dict() if self.lock is not None else None,
            "refusal": self.refusal.to_dict() if self.refusal else None,
            "error": self.error,
            "facts": self.facts.to_dict() if self.facts else None,
        }


def plan_provision(project: Project, host: Host, facts: HostFacts, facts_source: str = "probe over SSH", target_archs: tuple[str, ...] = ()) -> PlanResult:
    """The lock `provision` would install on `host` given `facts`, or the refusal. Touches nothing.

    Args:
        facts_source: how the facts were read (shown in the plan).
        target_archs: GPU architectures to plan for when the facts show no GPU.
    Returns:
        a PlanResult with the lock or the refusal.
    Raises:
        ConfigError: bad arguments (unknown release or architecture).
    """
    facts, result = lock_kind(project.engine.backend).plan(project, host, facts, target_archs)
    if isinstance(result, Refusal):
        return PlanResult(host.name, facts_source, facts, None, result)
    return PlanResult(host.name, facts_source, facts, result, None)


DEFAULT_CONNECT_TIMEOUT_S = 5  # the same default as `doctor --connect-timeout`


def plan_hosts(
    project: Project,
    hosts: list[Host],
    facts_file: str | None = None,
    target_archs: tuple[str, ...] = (),
    probe: Callable[[Host], HostFacts] | None = None,
    connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S,
    transport: Transport = SSH,
    progress: Progress = silent,
) -> list[PlanResult]:
    """Plan every host: from `facts_file` (one host only) or a live probe of each, all probed at once.

    Unreachable hosts become a PlanResult with `error`, so one dead host does not hide the others'
    plans; probing in parallel means two dead hosts cost one connect timeout, not two.

    Args:
        facts_file: a recorded probe of the one host in `hosts` (nothing is probed then).
        target_archs: GPU architectures to plan for when the facts show no GPU.
        probe: host -> facts (default: the probe script over SSH with engine.install.python).
        connect_timeout_s: SSH connect timeout of each live probe.
        transport: the SSH seam of the default probe.
        progress: told when probing starts and as each host answers.
    Returns:
        one PlanResult per host, in the order of `hosts`.
    Raises:
        ConfigError: `facts_file` with more than one host, or a malformed facts file.
    """
    if facts_file and len(hosts) != 1:
        raise ConfigError(f"--facts {facts_file} describes one host: name it (provision --plan --hosts HOST --facts FILE)")
    if facts_file:
        recorded = load_facts(facts_file)  # ConfigError first: bad input before any host
        return [plan_provision(project, hosts[0], recorded, facts_file, target_archs)]
    python = project.engine.install.python
    probe = probe or (lambda host: probe_host(host, python=python, connect_timeout_s=connect_timeout_s, transport=transport))
    progress(f"plan: probing {len(hosts)} host(s) in parallel (SSH connect timeout {connect_timeout_s}s)")
    results = []
    for host, facts in zip(hosts, probe_in_parallel(hosts, probe, progress)):
        if isinstance(facts, HostError):
            results.append(PlanResult(host.name, "probe over SSH", None, None, None, str(facts)))
        else:
            results.append(plan_provision(project, host, facts, "probe over SSH", target_archs))
    return results


def render_side_by_side(results: list[PlanResult]) -> str:
    """A plain-text table, one column per host; refusals and warnings listed under it."""
    columns = []
    for r in results:
        if r.lock is not None:
            columns.append((r.host, r.lock.plan_rows()))
        else:
            columns.append((r.host, {"backend": "REFUSED" if r.refusal else "UNREACHABLE"}))
    keys: list[str] = []
    for _, rows in columns:
        keys += [k for k in rows if k not in keys]
    widths = [max(len(k) for k in keys)] + [max(len(h), *(len(rows.get(k, "")) for k in keys)) for h, rows in columns]
    lines = ["  ".join([" " * widths[0]] + [h.ljust(w) for (h, _), w in zip(columns, widths[1:])])]
    for k in keys:
        lines.append("  ".join([k.ljust(widths[0])] + [rows.get(k, "").ljust(w) for (_, rows), w in zip(columns, widths[1:])]))
    notes = []
    for r in results:
        if r.refusal:
            notes += [f"{r.host}: refused: {reason.message}" for reason in r.refusal.reasons]
        if r.error:
            notes.append(f"{r.host}: {r.error}")
        if r.lock is not None:
            notes += [f"{r.host}: warning: {w}" for w in r.lock.warnings]
            notes += [f"{r.host}: not installable: {b}" for b in r.lock.blockers]
    return "\n".join(lines + ([""] + notes if notes else []))


def plan_exit_code(results: list[PlanResult]) -> int:
    """0 when every host has a lock, 1 when one is refused or unreachable."""
    return 0 if all(r.ok for r in results) else 1


def plan_document(results: list[PlanResult]) -> dict:
    return {"ok": all(r.ok for r in results), "hosts": [r.to_dict() for r in results]}


def lock_for_provision(project: Project, host: Host, facts: HostFacts | None = None):
    """The lock `provision` installs on `host` (probing it when `facts` is None).

    Raises:
        HostError: the host refuses a lock (the refusal's reasons and fixes) or is unreachable.
        ConfigError: bad settings (unknown release).
    """
    facts = facts or probe_host(host, python=project.engine.install.python)
    result = plan_provision(project, host, facts)
    if result.refusal:
        raise HostError(f"host {host.name}: no environment can be built: {result.refusal.message}")
    return result.lock


__all__ += ["PlanResult", "plan_provision", "plan_hosts", "render_side_by_side", "plan_document", "plan_exit_code", "lock_for_provision"]
