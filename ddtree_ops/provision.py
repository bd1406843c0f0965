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

from .ansible import run_playbook
from .config import Host, Project
from .exceptions import ConfigError, HostError
from .lock import Lock, resolve_lock
from .manifest import Manifest, lock_pins, manifest_args, parse_manifest
from .probe import MANIFEST_SCRIPT

FACTS_TASK = "Read the host's Python, architecture and OS"
MANIFEST_TASK = "Verify the environment's ABI and keep its manifest beside it"
ENVS_DIR = "/opt/ddtree/envs"
IMAGES_DIR = "/opt/ddtree/images"
STAGING_DIR = "/opt/ddtree/wheelhouse"  # where a wheelhouse is unpacked on the host while an env is built
DOCKER_ENGINE_PLAYBOOK = "container_engine.yml"
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
    if project.engine.install.mode == "container":
        from .container import docker_sdk
        from .lab.docker import engine_answers

        if docker_sdk() is None:
            raise ConfigError("engine.install.mode container builds the engine image here with the Docker SDK: pip install docker")
        if not engine_answers():
            raise ConfigError(
                "engine.install.mode container builds the engine image on this machine, but no Docker Engine answers here "
                "(`docker info` failed): start Docker, or set engine.install.mode: venv"
            )


def provision(
    project: Project,
    hosts: list[Host],
    *,
    resolve: Callable[[Project, Host, dict], Lock] = resolve_lock,
    probe: Callable[[Host], object] | None = None,
    log_dir: Path | None = None,
    on_progress: Callable[[str], None] = lambda line: None,
) -> ProvisionReport:
    """Build (or confirm) each host's engine environment.

    Args:
        project: the validated project.
        hosts: the hosts to provision (already checked against the project).
        resolve: facts → lock, for the reference backend.
        probe: host → HostFacts, for the sglang backend (default: the probe script over SSH).
        log_dir: where the Ansible logs go (default: the state dir).
        on_progress: container mode: the image build's output lines.
    Returns:
        a ProvisionReport with one row per host.
    Raises:
        ConfigError: something in the project cannot be provisioned (nothing touched).
        HostError: a host is unreachable or a step failed on it.
    """
    from .install import install_commands
    from .wheelhouse import engine_wheel_name, ensure_wheelhouse

    check_supported(project)
    clock = time.monotonic()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal clock
        now = time.monotonic()
        timings[name] = round(now - clock, 1)
        clock = now

    container_mode = project.engine.install.mode == "container"
    if project.engine.backend == "sglang":
        locks = resolve_sglang_locks(project, hosts, probe)
        lap("probe_resolve")
    else:
        locks = _resolve_reference_locks(project, hosts, resolve, container_mode)
        lap("facts_resolve")
    source = project.engine.install.source if project.engine.backend == "sglang" else "wheelhouse"
    tarballs = {lock.short_hash: ensure_wheelhouse(lock, source=source) for lock in locks.values()}
    lap("wheelhouse")
    image_tags: dict[str, str] = {}
    loaded: set[str] = set()
    engine_changed: dict[str, int] = {}
    if container_mode:
        image_tags, loaded, engine_changed = _ship_images(project, hosts, locks, tarballs, source, lap, log_dir, on_progress)
    engine_wheel = engine_wheel_name()
    staging = {name: f"{STAGING_DIR}/{lock.short_hash}" for name, lock in locks.items()}

    extravars = {
        "ddtree_provision_locks": {
            name: {
                "hash": lock.hash,
                "short_hash": lock.short_hash,
                "python_tag": lock.python_tag,
                "wheelhouse_tar": str(tarballs[lock.short_hash]),
                "manifest_args": manifest_args(project.engine.backend, lock_pins(lock.requirements)),
                "install_commands": install_commands(lock, staging[name], source=source, engine_wheel=engine_wheel),
                "image_tag": image_tags.get(lock.short_hash, ""),
                "docker_gpus": _gives_gpus(project, name, lock),
            }
            for name, lock in locks.items()
        },
        "ddtree_provision_mode": project.engine.install.mode,
        "ddtree_provision_python": project.engine.install.python,
        "ddtree_provision_envs_dir": ENVS_DIR,
        "ddtree_provision_images_dir": IMAGES_DIR,
        "ddtree_provision_staging_dir": STAGING_DIR,
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
                env=f"{IMAGES_DIR if container_mode else ENVS_DIR}/{lock.short_hash}",
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


def _resolve_reference_locks(project: Project, hosts: list[Host], resolve, container_mode: bool) -> dict[str, Lock]:
    facts = read_facts(project, hosts)
    locks: dict[str, Lock] = {}
    for host in hosts:
        if host.name not in facts:
            raise ConfigError(f"host {host.name}: no facts came back; see the Ansible log")
        host_facts = facts[host.name]
        if container_mode:
            from .container import base_python_version

            # The env lives in the image: its Python, not the host's, decides the wheels.
            host_facts = {**host_facts, "python_version": base_python_version()}
        locks[host.name] = resolve(project, host, host_facts)
    return locks


def resolve_sglang_locks(project: Project, hosts: list[Host], probe=None) -> dict[str, object]:
    """Each host's CUDA lock, from its live probe (read-only). Every host is resolved before any is changed.

    Raises:
        ConfigError: a lock can be planned but not installed (its blockers say why).
        HostError: a host's probe failed, or no lock fits a host (each reason with its fix).
    """
    from .plan import plan_provision
    from .probe import probe_host

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


def _gives_gpus(project: Project, host_name: str, lock) -> bool:
    """Whether containers on the host get GPUs: it lists GPU UUIDs, or its probe found GPUs (sglang locks)."""
    return bool(project.host(host_name).gpus) or bool(getattr(lock, "gpu_archs", ()))


def _same_machine_or_refuse(lock) -> None:
    """An image builds for this machine's architecture; a lock for another one cannot be built here."""
    import platform

    from .closure import machine_of

    here = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
    wanted = machine_of(lock.platform)
    if wanted != here:
        raise ConfigError(
            f"the lock is for {wanted} hosts but this machine is {here}: container mode builds the image here, "
            f"so build on a {wanted} control node or use engine.install.mode: venv"
        )


def _ship_images(project, hosts, locks, tarballs, source, lap, log_dir, on_progress) -> tuple[dict[str, str], set[str], dict[str, int]]:
    """Container mode: build each lock's image here, start Docker on the hosts, stream the image to those without it.

    Returns (short hash -> tag, hosts the image was loaded on now, host -> Ansible's changed count).
    """
    from .container import ensure_engine_image, ship_image

    tags: dict[str, str] = {}
    for lock in locks.values():
        if lock.short_hash not in tags:
            _same_machine_or_refuse(lock)
            tags[lock.short_hash], _ = ensure_engine_image(lock, tarballs[lock.short_hash], source, on_progress)
    lap("image")
    engine_vars = {"ddtree_provision_locks": {name: {"docker_gpus": _gives_gpus(project, name, lock)} for name, lock in locks.items()}}
    result = run_playbook(DOCKER_ENGINE_PLAYBOOK, project, hosts, engine_vars, log_dir=log_dir)
    lap("docker_engine")
    loaded = {host.name for host in hosts if ship_image(host, tags[locks[host.name].short_hash])}
    lap("ship")
    return tags, loaded, {name: outcome.changed for name, outcome in result.hosts.items()}
