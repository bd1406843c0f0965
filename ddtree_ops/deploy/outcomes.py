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


@dataclass
class RollbackReport:
    rollback_id: str
    ok: bool
    hosts: list[HostDeployOutcome]
    failure: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def new_deploy_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


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
