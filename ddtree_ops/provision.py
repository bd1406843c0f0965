"""`provision`: read each host's facts, resolve its lock, build the wheelhouse here, build the env there.

The env `/opt/ddtree/envs/<lock short hash>` is immutable: a host whose env is already complete
is left alone (Ansible reports changed=0 and the report says "up to date").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from .ansible import run_playbook
from .config import Host, Project
from .exceptions import ConfigError
from .lock import SGLANG_NOT_YET, Lock, resolve_lock

FACTS_TASK = "Read the host's Python, architecture and OS"
ENVS_DIR = "/opt/ddtree/envs"
LAB_MODELS_IN_ENGINE = "src/ddtree_engine/lab_models"


@dataclass(frozen=True)
class HostProvision:
    host: str
    address: str
    status: str  # "provisioned" (the env was built now) | "up to date"
    env: str
    lock_hash: str
    python: str
    changed: int  # Ansible's changed count for this host

    def line(self) -> str:
        return f"{self.host}: {self.status} (env {self.env.rsplit('/', 1)[-1]})"


@dataclass(frozen=True)
class ProvisionReport:
    hosts: list[HostProvision]
    locks: dict[str, dict]  # short hash -> lock
    log_path: str
    timings_s: dict[str, float]

    def to_dict(self) -> dict:
        return {
            "hosts": [asdict(h) for h in self.hosts],
            "locks": self.locks,
            "log_path": self.log_path,
            "timings_s": self.timings_s,
        }


def facts_from_event(event: dict) -> tuple[str, dict] | None:
    """(host, facts) from the runner event of the facts task, else None."""
    data = event.get("event_data") or {}
    if event.get("event") != "runner_on_ok" or data.get("task") != FACTS_TASK:
        return None
    ansible_facts = (data.get("res") or {}).get("ansible_facts") or {}
    python = ansible_facts.get("ansible_python") or {}
    version = python.get("version") or {}
    return data.get("host"), {
        "python_version": ".".join(str(version.get(k, "")) for k in ("major", "minor", "micro")),
        "python_executable": python.get("executable"),
        "architecture": ansible_facts.get("ansible_architecture"),
        "distribution": f"{ansible_facts.get('ansible_distribution', '')} {ansible_facts.get('ansible_distribution_version', '')}".strip(),
    }


def read_facts(project: Project, hosts: list[Host]) -> dict[str, dict]:
    """Each host's facts (python version, architecture), read over Ansible. Raises HostError."""
    facts: dict[str, dict] = {}

    def collect(event: dict) -> None:
        found = facts_from_event(event)
        if found:
            facts[found[0]] = found[1]

    run_playbook("facts.yml", project, hosts, {}, on_event=collect)
    return facts


def verify_lab_generation(project: Project) -> bool:
    """Whether provision can prove a real generation: the project uses the `lab` pair and the engine ships it."""
    from .wheelhouse import engine_source_dir

    uses_lab = project.engine.target == "lab" and project.engine.draft == "lab"
    return uses_lab and (engine_source_dir() / LAB_MODELS_IN_ENGINE).is_dir()


def check_supported(project: Project) -> None:
    """Refuse what this provision cannot do yet, before any host is touched."""
    if project.engine.backend == "sglang":
        raise ConfigError(SGLANG_NOT_YET)
    if project.engine.install.mode != "venv":
        raise ConfigError(
            f"engine.install.mode {project.engine.install.mode!r} is not yet supported by provision; use 'venv'"
        )


def provision(
    project: Project,
    hosts: list[Host],
    *,
    resolve: Callable[[Project, Host, dict], Lock] = resolve_lock,
    log_dir: Path | None = None,
) -> ProvisionReport:
    """Build (or confirm) each host's engine environment.

    Args:
        project: the validated project.
        hosts: the hosts to provision (already checked against the project).
        resolve: facts → lock (the seam the GPU resolver replaces).
        log_dir: where the Ansible logs go (default: the state dir).
    Returns:
        a ProvisionReport with one row per host.
    Raises:
        ConfigError: something in the project cannot be provisioned (nothing touched).
        HostError: a host is unreachable or a step failed on it.
    """
    from .wheelhouse import ensure_wheelhouse

    check_supported(project)
    clock = time.monotonic()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal clock
        now = time.monotonic()
        timings[name] = round(now - clock, 1)
        clock = now

    facts = read_facts(project, hosts)
    lap("facts")
    locks: dict[str, Lock] = {}
    for host in hosts:
        if host.name not in facts:
            raise ConfigError(f"host {host.name}: no facts came back; see the Ansible log")
        locks[host.name] = resolve(project, host, facts[host.name])
    lap("resolve")
    tarballs = {lock.short_hash: ensure_wheelhouse(lock) for lock in locks.values()}
    lap("wheelhouse")

    extravars = {
        "ddtree_provision_locks": {
            name: {
                "hash": lock.hash,
                "short_hash": lock.short_hash,
                "python_tag": lock.python_tag,
                "wheelhouse_tar": str(tarballs[lock.short_hash]),
            }
            for name, lock in locks.items()
        },
        "ddtree_provision_python": project.engine.install.python,
        "ddtree_provision_envs_dir": ENVS_DIR,
        # Real model paths are checked by deploy's health gate; the `lab` pair can be checked now.
        "ddtree_provision_verify_generate": verify_lab_generation(project),
    }
    result = run_playbook("provision.yml", project, hosts, extravars, log_dir=log_dir)
    lap("hosts")
    rows = []
    for host in hosts:
        lock = locks[host.name]
        changed = result.hosts[host.name].changed
        rows.append(
            HostProvision(
                host=host.name,
                address=host.address,
                status="provisioned" if changed else "up to date",
                env=f"{ENVS_DIR}/{lock.short_hash}",
                lock_hash=lock.hash,
                python=lock.python_tag,
                changed=changed,
            )
        )
    return ProvisionReport(
        hosts=rows,
        locks={lock.short_hash: lock.to_dict() for lock in locks.values()},
        log_path=str(result.log_path),
        timings_s=timings,
    )
