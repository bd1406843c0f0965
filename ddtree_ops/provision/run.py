"""`provision`: read each host's facts, resolve its lock, build the wheelhouse here, build the env there.

venv mode: the env `/opt/ddtree/envs/<lock short hash>` is immutable: a host whose env is already
complete is left alone (Ansible reports changed=0 and the report says "up to date").
Container mode: the engine image `ddtree-engine:<lock short hash>` is built here from the same
wheelhouse, each host's Docker Engine is started, the image is streamed to hosts that lack it
(`docker save | ssh docker load`), and `/opt/ddtree/images/<lock short hash>/` records it.
Every run then verifies the env (in the image, on the host) with the ABI manifest script and stores
the result as `abi-manifest.json` in that directory, which `deploy` reads before it touches the host.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..progress import Progress, silent
from ..config import Host, Project
from ..exceptions import ConfigError, HostError
from ..hosts import layout
from ..hosts.ansible import run_playbook
from ..hosts.probe import MANIFEST_SCRIPT, HostFacts, probe_host
from ..hosts.ssh import SSH, Transport
from .engine_source import engine_source_dir, engine_wheel_name
from .install import install_commands
from .kinds import lock_kind
from .lock import EngineLock, Lock, resolve_lock
from .manifest import Manifest, parse_manifest
from .modes import gives_gpus, install_mode
from .plan import plan_provision
from .wheelhouse import ensure_wheelhouse

FACTS_TASK = "Read the host's Python, architecture and OS"
MANIFEST_TASK = "Verify the environment's ABI and keep its manifest beside it"
LAB_MODELS_IN_ENGINE = "src/ddtree_engine/lab_models"


@dataclass(frozen=True)
class HostProvision:
    host: str
    address: str
    status: str  # "provisioned" (the env was built or the image loaded now) | "up to date"
    env: str  # the env dir (venv mode) or the image's record dir (container mode)
    lock_hash: str
    python: str
    changed: int  # Ansible's changed count for this host
    manifest: str  # "ok" | "failed: <check>, <check>"
    manifest_failures: list[str]  # "<check> — <reason> (<class>)" per failed check
    image: str | None = None  # container mode: the engine image's tag

    @property
    def manifest_ok(self) -> bool:
        return self.manifest == "ok"

    def line(self) -> str:
        what = f"image {self.image}" if self.image else f"env {self.env.rsplit('/', 1)[-1]}"
        return f"{self.host}: {self.status} ({what}), ABI manifest {self.manifest}"


@dataclass(frozen=True)
class ProvisionReport:
    hosts: list[HostProvision]
    locks: dict[str, dict]  # short hash -> lock
    log_path: str
    timings_s: dict[str, float]

    @property
    def ok(self) -> bool:
        return all(h.manifest_ok for h in self.hosts)

    def failure(self) -> str | None:
        """Which hosts' envs failed their ABI manifest, and why (None when all passed)."""
        bad = [h for h in self.hosts if not h.manifest_ok]
        if not bad:
            return None
        lines = []
        for h in bad:
            lines.append(f"host {h.host!r}: the engine environment {h.env} failed its ABI manifest:")
            lines += [f"  {line}" for line in h.manifest_failures]
        lines.append("deploy refuses these hosts until `ddtree-ops provision` verifies their environment again")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "hosts": [{**asdict(h), "manifest_ok": h.manifest_ok} for h in self.hosts],
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


def manifest_from_event(event: dict) -> tuple[str, Manifest] | None:
    """(host, manifest) from the runner event of the manifest task, else None.

    Raises HostError when the script printed something that is not a valid manifest.
    """
    data = event.get("event_data") or {}
    if event.get("event") != "runner_on_ok" or data.get("task") != MANIFEST_TASK:
        return None
    host = data.get("host")
    stdout = (data.get("res") or {}).get("stdout") or ""
    try:
        return host, parse_manifest(json.loads(stdout), f"host {host}: ABI manifest")
    except (json.JSONDecodeError, ConfigError) as err:
        raise HostError(f"host {host}: the ABI manifest script did not print a valid manifest ({err}): {stdout[-300:]!r}") from None


def read_facts(project: Project, hosts: list[Host], run_playbook: Callable[..., Any] = run_playbook) -> dict[str, dict]:
    """Each host's facts (python version, architecture), read over Ansible (the `run_playbook` seam). Raises HostError."""
    facts: dict[str, dict] = {}

    def collect(event: dict) -> None:
        found = facts_from_event(event)
        if found:
            facts[found[0]] = found[1]

    run_playbook("facts.yml", project, hosts, {}, on_event=collect)
    return facts


def verify_lab_generation(project: Project) -> bool:
    """Whether provision can prove a real generation: the project uses the `lab` pair and the engine ships it."""
    uses_lab = project.engine.target == "lab" and project.engine.draft == "lab"
    return uses_lab and (engine_source_dir() / LAB_MODELS_IN_ENGINE).is_dir()


def check_supported(project: Project) -> None:
    """Refuse what this provision cannot do yet, before any host is touched."""
    install_mode(project.engine.install.mode).check_supported()


def provision(
    project: Project,
    hosts: list[Host],
    *,
    resolve: Callable[[Project, Host, dict], Lock] = resolve_lock,
    probe: Callable[[Host], HostFacts] | None = None,
    log_dir: Path | None = None,
    progress: Progress = silent,
    transport: Transport = SSH,
    run_playbook: Callable[..., Any] = run_playbook,
) -> ProvisionReport:
    """Build (or confirm) each host's engine environment.

    Args:
        project: the validated project.
        hosts: the hosts to provision (already checked against the project).
        resolve: facts → lock, for the reference backend.
        probe: host → HostFacts, for the sglang backend (default: the probe script over SSH).
        log_dir: where the Ansible logs go (default: the state dir).
        progress: container mode: the image build's output lines.
        transport: the SSH seam (container mode streams the image through it).
        run_playbook: the Ansible seam.
    Returns:
        a ProvisionReport with one row per host.
    Raises:
        ConfigError: something in the project cannot be provisioned (nothing touched).
        HostError: a host is unreachable or a step failed on it.
    """
    check_supported(project)
    clock = time.monotonic()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal clock
        now = time.monotonic()
        timings[name] = round(now - clock, 1)
        clock = now

    mode = install_mode(project.engine.install.mode)
    kind = lock_kind(project.engine.backend)
    if kind.facts_from_probe:
        locks = resolve_sglang_locks(project, hosts, probe)
        lap("probe_resolve")
    else:
        locks = _resolve_reference_locks(project, hosts, resolve, run_playbook)
        lap("facts_resolve")
    source = kind.install_source(project)
    tarballs = {lock.short_hash: ensure_wheelhouse(lock, source=source) for lock in locks.values()}
    lap("wheelhouse")
    prepared = mode.prepare(project, hosts, locks, tarballs, source, lap, log_dir, progress, transport, run_playbook)
    image_tags, loaded, engine_changed = prepared.image_tags, prepared.loaded, prepared.changed
    engine_wheel = engine_wheel_name()
    staging = {name: layout.staging_dir(lock.short_hash) for name, lock in locks.items()}

    extravars = {
        "ddtree_provision_locks": {
            name: {
                "hash": lock.hash,
                "short_hash": lock.short_hash,
                "python_tag": lock.python_tag,
                "wheelhouse_tar": str(tarballs[lock.short_hash]),
                "manifest_args": lock.manifest_args(),
                "install_commands": install_commands(lock, staging[name], source=source, engine_wheel=engine_wheel),
                "image_tag": image_tags.get(lock.short_hash, ""),
                "docker_gpus": gives_gpus(project, name, lock),
            }
            for name, lock in locks.items()
        },
        "ddtree_provision_mode": project.engine.install.mode,
        "ddtree_provision_python": project.engine.install.python,
        "ddtree_provision_envs_dir": layout.ENVS_DIR,
        "ddtree_provision_images_dir": layout.IMAGES_DIR,
        "ddtree_provision_staging_dir": layout.STAGING_DIR,
        "ddtree_provision_manifest_script": str(MANIFEST_SCRIPT),
        # Real model paths are checked by deploy's health gate; the `lab` pair can be checked now.
        "ddtree_provision_verify_generate": verify_lab_generation(project),
    }
    manifests: dict[str, Manifest] = {}
    unreadable: list[HostError] = []

    def collect(event: dict) -> None:
        # Raised after the playbook: an exception inside ansible-runner's event callback would be lost.
        try:
            found = manifest_from_event(event)
        except HostError as err:
            unreadable.append(err)
            return
        if found:
            manifests[found[0]] = found[1]

    result = run_playbook("provision.yml", project, hosts, extravars, log_dir=log_dir, on_event=collect)
    lap("hosts")
    if unreadable:
        raise unreadable[0]
    rows = []
    for host in hosts:
        lock = locks[host.name]
        changed = result.hosts[host.name].changed + engine_changed.get(host.name, 0) + (host.name in loaded)
        if host.name not in manifests:
            raise HostError(f"host {host.name}: the ABI manifest task reported nothing; see {result.log_path}")
        manifest = manifests[host.name]
        rows.append(
            HostProvision(
                host=host.name,
                address=host.address,
                status="provisioned" if changed else "up to date",
                env=mode.record_dir(lock.short_hash),
                lock_hash=lock.hash,
                python=lock.python_tag,
                changed=changed,
                manifest="ok" if manifest.ok else "failed: " + ", ".join(c.name for c in manifest.failures),
                manifest_failures=manifest.failure_lines(),
                image=image_tags.get(lock.short_hash),
            )
        )
    return ProvisionReport(
        hosts=rows,
        locks={lock.short_hash: lock.to_dict() for lock in locks.values()},
        log_path=str(result.log_path),
        timings_s=timings,
    )


def _resolve_reference_locks(project: Project, hosts: list[Host], resolve, run_playbook) -> dict[str, Lock]:
    try:
        facts = read_facts(project, hosts, run_playbook)
    except HostError as err:
        # Facts come first, from every host at once: when one cannot answer, none has been changed yet.
        raise HostError(f"no host was changed (provision reads every host's facts before building): {err}") from None
    mode = install_mode(project.engine.install.mode)
    locks: dict[str, Lock] = {}
    for host in hosts:
        if host.name not in facts:
            raise ConfigError(f"host {host.name}: no facts came back; see the Ansible log")
        host_facts = facts[host.name]
        # Container mode: the env lives in the image, so its Python, not the host's, decides the wheels.
        host_facts = {**host_facts, "python_version": mode.env_python(host_facts.get("python_version"))}
        locks[host.name] = resolve(project, host, host_facts)
    return locks


def resolve_sglang_locks(project: Project, hosts: list[Host], probe=None) -> dict[str, EngineLock]:
    """Each host's CUDA lock, from its live probe (read-only). Every host is resolved before any is changed.

    Args:
        probe: host -> HostFacts (default: the probe script over SSH with engine.install.python).
    Returns:
        host name -> lock.
    Raises:
        ConfigError: a lock can be planned but not installed (its blockers say why).
        HostError: a host's probe failed, or no lock fits a host (each reason with its fix).
    """
    probe = probe or (lambda host: probe_host(host, python=project.engine.install.python))
    locks, refusals, blocked = {}, [], []
    for host in hosts:
        result = plan_provision(project, host, probe(host))
        if result.refusal is not None:
            refusals += [f"  - {reason.message}" for reason in result.refusal.reasons]
        elif result.lock.blockers:
            blocked += [f"  - host {host.name}: {b}" for b in result.lock.blockers]
        else:
            locks[host.name] = result.lock
    if blocked:
        raise ConfigError("no host was changed; these locks cannot be installed:\n" + "\n".join(blocked))
    if refusals:
        raise HostError("no host was changed; no lock fits:\n" + "\n".join(refusals))
    return locks
