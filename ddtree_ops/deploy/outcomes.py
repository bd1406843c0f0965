"""What a deploy, a rollback and their hosts and services came to; and what the playbooks wrote back."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..hosts import layout

JOURNAL_TAIL_LINES = 12
OWN_JOURNAL_LINES = 4


@dataclass
class ServiceOutcome:
    host: str
    service: str
    port: int
    # deploy: healthy (a new release) | unchanged (its release was already installed, and it is healthy)
    #   | unhealthy | mismatch | rolled back | stopped | not deployed | skipped | interrupted (Ctrl-C);
    # rollback: rolled back | unhealthy | no previous release | not deployed | failed
    status: str
    release_id: str | None = None
    previous_release_id: str | None = None
    release_changed: bool = False
    healthy_after_s: float | None = None
    detail: str = ""
    # What the service runs (deploy: what was deployed; None where unknown, as after a rollback).
    algorithm: str | None = None
    budget: int | None = None
    topk: int | None = None
    block_size: int | None = None

    def settings(self) -> str:
        """`ddtree budget 15, topk 8, block 16`, `dflash block 16`, `ar`; "-" when unknown."""
        if self.algorithm is None:
            return "-"
        parts = []
        if self.algorithm == "ddtree":
            parts += [f"budget {self.budget}", f"topk {self.topk}"]
        if self.algorithm in ("ddtree", "dflash") and self.block_size is not None:
            parts.append(f"block {self.block_size}")
        return f"{self.algorithm} {', '.join(parts)}".strip()


@dataclass
class HostDeployOutcome:
    host: str
    # deployed | rolled back | failed | refused (env failed its manifest) | skipped | interrupted (Ctrl-C)
    status: str
    changed: int | None = None  # Ansible tasks changed on the host by the deploy playbook
    services: list[ServiceOutcome] = field(default_factory=list)
    error: str | None = None


def failure_entry(host: str | None, service: str | None, message: str) -> dict[str, Any]:
    """One item of a JSON document's `failures` (the envelope every command shares)."""
    return {"host": host, "service": service, "message": message}


def _envelope(operation_id: str, ok: bool, hosts: list[HostDeployOutcome], warnings: list[str],
              failures: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    return {
        "ok": ok,
        "operation_id": operation_id,
        "changed": any(s.release_changed for h in hosts for s in h.services),
        "warnings": list(warnings),
        "failures": list(failures),
        "hosts": [asdict(h) for h in hosts],
    }


@dataclass
class DeployReport:
    deploy_id: str
    ok: bool
    hosts: list[HostDeployOutcome]
    warnings: list[str] = field(default_factory=list)
    failure: str | None = None  # the whole story for stderr (journal tails, what was rolled back)
    failures: list[dict[str, Any]] = field(default_factory=list)  # failure_entry() items

    def to_dict(self) -> dict[str, Any]:
        """The `--json` document: the common envelope (schemas/deploy.json); `operation_id` is the deploy id."""
        return _envelope(self.deploy_id, self.ok, self.hosts, self.warnings, self.failures)


class DeployInterrupted(KeyboardInterrupt):
    """Ctrl-C during a rollout. Still a KeyboardInterrupt (a sweep stops on it as on any Ctrl-C);
    `report` says which host was interrupted, that later hosts were not touched, and what converges it."""

    def __init__(self, report: DeployReport):
        super().__init__(report.failure)
        self.report = report


@dataclass
class RollbackReport:
    rollback_id: str
    ok: bool
    hosts: list[HostDeployOutcome]
    failure: str | None = None
    warnings: list[str] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The `--json` document (schemas/rollback.json); `operation_id` is the rollback id."""
        return _envelope(self.rollback_id, self.ok, self.hosts, self.warnings, self.failures)


def new_deploy_id() -> str:
    """`20260102T030405123Z` (UTC, to the millisecond).

    A release counts as changed by a rollout when state.json names that rollout's id: two deploys
    within one second must not share one, or the second would claim the first one's releases.
    """
    now = datetime.now(timezone.utc)
    return now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z"


def read_state(report_dir: Path, host: str) -> dict[str, Any]:
    """The host's state.json as the playbook copied it back into `report_dir` ({} when it did not)."""
    path = report_dir / f"{host}.state.json"
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def service_states(report_dir: Path, host: str) -> dict[str, Any]:
    """state.json's per-service entries, as the playbook copied them back."""
    return layout.service_entries(read_state(report_dir, host))


def journal_tail(report_dir: Path, host: str, service: str, lines: int = JOURNAL_TAIL_LINES) -> str:
    path = report_dir / f"{host}-{service}.journal"
    if not path.exists():
        return ""
    all_lines = [line for line in path.read_text().splitlines() if line.strip()]
    # systemd's own restart chatter can fill the tail; the service's last words say why it died.
    own = [i for i, line in enumerate(all_lines) if f" ddtree-{service}[" in line][-OWN_JOURNAL_LINES:]
    keep = sorted(set(range(max(0, len(all_lines) - lines), len(all_lines))) | set(own))
    return "\n".join(all_lines[i] for i in keep)


def changed_count(result: Any, host: str) -> int | None:
    outcome = (getattr(result, "hosts", None) or {}).get(host)
    return getattr(outcome, "changed", None) if outcome is not None else None
