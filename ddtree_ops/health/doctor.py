"""`doctor`: the preflight. Control node first (Ansible, ansible-runner, SSH keys, Docker for container
mode), then each host in parallel (reachable, probe, lock resolvable, ABI manifest valid, drift).

Every check is a `Check` row; nothing raises for a failed check. The report's exit code is 0 when
nothing failed (warnings allowed), 1 otherwise; bad input (unknown host) is a ConfigError before
anything runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from importlib.metadata import version as dist_version
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ..config import Host, Project
from ..exceptions import DdtreeOpsError, HostError
from ..hosts.known_hosts import host_key_message, host_key_problem
from ..hosts.layout import ENVS_DIR, env_dir, image_record_dir
from ..hosts.probe import HostFacts, probe_host
from ..hosts.ssh import SSH, Transport
from ..progress import Progress, silent
from ..provision.container import docker_sdk, image_tag, remote_docker
from ..provision.manifest import read_env_verdict, run_on_host
from ..provision.modes import install_mode
from ..provision.plan import plan_provision

STATUS_MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


@dataclass(frozen=True)
class Check:
    scope: str  # "control" or a host name
    name: str
    status: str  # ok | warn | fail | skip
    detail: str

    def line(self) -> str:
        return f"{STATUS_MARK[self.status]}  {self.scope:<14} {self.name:<14} {self.detail}"


@dataclass(frozen=True)
class DoctorReport:
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_dict(self) -> dict:
        """The `--json` document (schemas/doctor.json): the common envelope; `checks` stays one flat
        list in check order, each naming its scope (`control` or a host)."""
        def where(c: Check) -> str | None:
            return None if c.scope == "control" else c.scope

        return {
            "ok": self.ok,
            "warnings": [f"{c.scope}: {c.name}: {c.detail}" for c in self.checks if c.status == "warn"],
            "failures": [{"host": where(c), "service": None, "message": f"{c.name}: {c.detail}"}
                         for c in self.checks if c.status == "fail"],  # fmt: skip
            "checks": [asdict(c) for c in self.checks],
        }

    def lines(self) -> list[str]:
        return [c.line() for c in self.checks]


# ---- control node -------------------------------------------------------------------------------


def control_checks(project: Project, container_mode: bool | None = None) -> list[Check]:
    """Checks of this machine: the tools provision/deploy use and the SSH keys hosts are reached with."""
    checks = []
    bin_path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    playbook = shutil.which("ansible-playbook", path=bin_path)
    if playbook:
        version = _first_line([playbook, "--version"])
        checks.append(Check("control", "ansible", "ok", f"{version} ({playbook})"))
    else:
        checks.append(Check("control", "ansible", "fail", "ansible-playbook is not installed beside this Python: pip install ansible-core"))
    if importlib.util.find_spec("ansible_runner") is not None:
        checks.append(Check("control", "ansible-runner", "ok", f"ansible-runner {dist_version('ansible-runner')}"))
    else:
        checks.append(Check("control", "ansible-runner", "fail", "the ansible_runner module is missing: pip install ansible-runner"))
    if shutil.which("ssh") is None:
        checks.append(Check("control", "ssh", "fail", "the ssh client is not installed: install openssh-client"))
    for key in sorted({h.ssh.key for h in project.hosts if h.ssh.key}):
        checks.append(ssh_key_check(key))
    if not any(h.ssh.key for h in project.hosts):
        checks.append(Check("control", "ssh key", "skip", "no host names a key: the SSH agent / default keys are used"))
    if container_mode is None:
        container_mode = install_mode(project.engine.install.mode).builds_image
    if container_mode:
        checks.append(docker_check())
    return checks


def ssh_key_check(key: str) -> Check:
    """The private key exists, is readable, and is not readable by others (ssh ignores such keys)."""
    path = Path(key).expanduser()
    if not path.exists():
        return Check("control", "ssh key", "fail", f"{path} does not exist: create it (ssh-keygen -t ed25519 -f {path}) or fix hosts[].ssh.key")
    if not os.access(path, os.R_OK):
        return Check("control", "ssh key", "fail", f"{path} is not readable by this user: chmod 600 {path} (and check its owner)")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return Check(
            "control", "ssh key", "fail", f"{path} has mode {mode:04o}; ssh refuses private keys others can read: chmod 600 {path}"
        )
    head = path.read_text(errors="replace")[:64]
    if "PRIVATE KEY" not in head:
        return Check("control", "ssh key", "fail", f"{path} is not a private key (no 'PRIVATE KEY' header): is it the .pub file?")
    return Check("control", "ssh key", "ok", f"{path} (mode {mode:04o})")


def docker_check() -> Check:
    docker = docker_sdk()
    if docker is None:
        return Check("control", "docker", "fail", "container mode needs the Docker SDK: pip install docker")
    try:
        client = docker.from_env(timeout=10)
        info = client.version()
    except Exception as err:  # noqa: BLE001 - any failure to reach the daemon is the finding
        return Check("control", "docker", "fail", f"the Docker daemon does not answer ({err}): start it, or check DOCKER_HOST and your group")
    return Check("control", "docker", "ok", f"Docker {info.get('Version', '?')} (API {info.get('ApiVersion', '?')})")


def _first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return out.splitlines()[0].strip() if out else "?"


# ---- hosts --------------------------------------------------------------------------------------


def host_checks(
    project: Project, host: Host, connect_timeout_s: int = 5, run_manifest: bool = True, transport: Transport = SSH,
    progress: Progress = silent,
) -> list[Check]:  # fmt: skip
    """The checks of one host; later checks are skipped (not failed) when an earlier one makes them moot.

    Args:
        connect_timeout_s: SSH connect timeout.
        run_manifest: also run the ABI manifest in the env (it imports torch/sglang there).
        transport: the SSH seam.
        progress: told before the slow steps (the probe, the manifest, the drift listing).
    Returns:
        the host's Check rows, in order.
    """

    def ssh(command: str, timeout_s: float) -> subprocess.CompletedProcess:
        return transport.call(host, command, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s)

    checks: list[Check] = []
    name = host.name
    target = f"{host.ssh.user}@{host.address}:{host.ssh.port}"
    try:
        proc = ssh("true", timeout_s=connect_timeout_s + 10)
        reachable, why = proc.returncode == 0, proc.stderr.strip()
    except subprocess.TimeoutExpired:
        reachable, why = False, f"no answer within {connect_timeout_s + 10}s"
    except FileNotFoundError:
        reachable, why = False, "the ssh client is not installed here"
    if not reachable:
        key_problem = host_key_problem(why)  # a refused host key is not an unreachable host: say how to trust it
        detail = host_key_message(host, key_problem, why) if key_problem else f"unreachable over SSH ({target}): {why or 'no message'}"
        checks.append(Check(name, "reachable", "fail", detail))
        skipped = "host key refused" if key_problem else "host unreachable"
        return checks + [Check(name, later, "skip", skipped) for later in ("probe", "lock", "manifest", "drift")]
    checks.append(Check(name, "reachable", "ok", target))

    progress(f"doctor: {name}: probing")
    try:
        facts = probe_host(host, python=project.engine.install.python, connect_timeout_s=connect_timeout_s, transport=transport)
    except HostError as err:
        checks.append(Check(name, "probe", "fail", str(err)))
        return checks + [Check(name, n, "skip", "no facts") for n in ("lock", "manifest", "drift")]
    checks.append(Check(name, "probe", "ok", describe_facts(facts)))

    lock, lock_check = resolve_for_doctor(project, host, facts)
    checks.append(lock_check)
    if lock is None:
        return checks + [Check(name, n, "skip", "no lock") for n in ("manifest", "drift")]

    if install_mode(project.engine.install.mode).builds_image:
        return checks + container_host_checks(host, lock, connect_timeout_s, transport)

    env = env_dir(lock.short_hash)
    listing = ssh(f"ls -1 {shlex.quote(ENVS_DIR)} 2>/dev/null || true", timeout_s=30)
    present = [e for e in listing.stdout.split() if e]
    if lock.short_hash not in present:
        others = f"; the host has {', '.join(present)}" if present else ""
        checks.append(Check(name, "manifest", "skip", f"{env} does not exist yet"))
        checks.append(Check(name, "drift", "warn", f"the lock's env {lock.short_hash} is not on the host{others} — run ddtree-ops provision --hosts {name}"))
        return checks

    if run_manifest:
        progress(f"doctor: {name}: running the ABI manifest in {env} (imports the engine's packages there)")
        checks.append(manifest_check(host, env, project.engine.backend, lock, transport))
    progress(f"doctor: {name}: comparing {env} with its lock")
    checks.append(drift_check(host, env, lock, connect_timeout_s, transport))
    return checks


def container_host_checks(host: Host, lock, connect_timeout_s: int, transport: Transport = SSH) -> list[Check]:
    """Container mode: the host's Docker Engine, the lock's image on it, and the manifest provision stored for it.

    There is no drift check: the image is immutable and tagged by the lock's hash.
    """
    name, tag, docker = host.name, image_tag(lock), remote_docker(host)
    proc = transport.call(host, f"systemctl is-active docker 2>&1; {docker} version --format '{{{{.Server.Version}}}}' 2>&1", timeout_s=30, connect_timeout_s=connect_timeout_s)
    lines = proc.stdout.split()
    if not lines or lines[0] != "active":
        return [
            Check(name, "docker", "fail", f"the Docker Engine is not running there ({' '.join(lines) or proc.stderr.strip()}): "
                  f"install it (and nvidia-container-toolkit on GPU hosts); provision starts an installed one"),
            Check(name, "image", "skip", "no Docker Engine"),
            Check(name, "manifest", "skip", "no Docker Engine"),
        ]
    checks = [Check(name, "docker", "ok", f"Docker {lines[-1]}")]
    inspect = transport.call(host, f"{docker} image inspect --format '{{{{.Id}}}}' {shlex.quote(tag)}", timeout_s=30, connect_timeout_s=connect_timeout_s)
    if inspect.returncode != 0:
        checks.append(Check(name, "image", "warn", f"{tag} is not on the host — run ddtree-ops provision --hosts {name}"))
        return checks + [Check(name, "manifest", "skip", f"{tag} not loaded")]
    checks.append(Check(name, "image", "ok", f"{tag} ({inspect.stdout.strip()[:19]})"))
    try:
        verdict = read_env_verdict(host, image_record_dir(lock.short_hash), timeout_s=30, mode="container", transport=transport)
    except HostError as err:
        return checks + [Check(name, "manifest", "fail", str(err))]
    status = "ok" if verdict.ok else "fail"
    return checks + [Check(name, "manifest", status, verdict.manifest.summary() if verdict.manifest else (verdict.problem or verdict.status))]


def describe_facts(facts: HostFacts) -> str:
    gpus = ", ".join(sorted({f"{g.name} ({g.sm})" for g in facts.gpus})) or "no GPU"
    driver = f"driver {facts.driver_version}" if facts.driver_version else "no driver"
    extra = f", NVML {facts.nvml_state}" if facts.nvml_state not in ("ok", "no-driver") else ""
    return f"{len(facts.gpus)}× {gpus}; {driver}{extra}; Python {facts.python_version}; {facts.os_id} {facts.os_version}"


def resolve_for_doctor(project: Project, host: Host, facts: HostFacts):
    """(lock or None, Check)."""
    try:
        result = plan_provision(project, host, facts)
    except DdtreeOpsError as err:
        return None, Check(host.name, "lock", "fail", str(err))
    if result.refusal:
        return None, Check(host.name, "lock", "fail", result.refusal.message)
    lock = result.lock
    if lock.blockers:
        return None, Check(host.name, "lock", "fail", "; ".join(lock.blockers))
    detail = lock.describe()
    warnings = lock.warnings
    return lock, Check(host.name, "lock", "warn" if warnings else "ok", detail + ("; " + "; ".join(warnings) if warnings else ""))


def manifest_check(host: Host, env: str, backend: str, lock, transport: Transport = SSH) -> Check:
    try:
        result = run_on_host(host, f"{env}/bin/python", backend, lock.pinned(), store_in=None, timeout_s=900, transport=transport)
    except HostError as err:
        return Check(host.name, "manifest", "fail", str(err))
    return Check(host.name, "manifest", "ok" if result.ok else "fail", result.summary())


_LIST_DISTS = (
    "import importlib.metadata as m, json; "
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
)
# Installer tooling pip leaves in every venv; never part of a lock, so never an "extra".
_TOOLING = frozenset({"pip", "setuptools", "wheel"})
_SHOWN = 10  # items listed per kind before "(+N more)": a detail line stays readable


@dataclass(frozen=True)
class Drift:
    """How an env's installed distributions differ from its lock's pins (names canonical, PEP 503).

    Each entry is `(name, installed, pinned)`; `installed` is None for a missing package, `pinned`
    is None for an extra one.
    """

    missing: tuple[tuple[str, None, str], ...] = ()
    wrong_version: tuple[tuple[str, str, str], ...] = ()
    wrong_build: tuple[tuple[str, str, str], ...] = ()
    extra: tuple[tuple[str, str, None], ...] = ()
    matched: int = 0  # pinned packages installed at exactly their pinned version and build

    @property
    def differs(self) -> bool:
        """True when a pinned package is missing or not the pinned version and build (extras do not count)."""
        return bool(self.missing or self.wrong_version or self.wrong_build)


def compare_versions(installed: str, pinned: str) -> str:
    """How one installed version stands against its pin.

    A pin with a local version (`2.9.1+cu130`) names one build: the installed version must equal it,
    local part included (`2.9.1+cu128` is another CUDA build, whose compiled kernels need another
    toolkit and driver). A pin without a local version (`3.20.0`) names a release: any local build of
    that release matches (`3.20.0+local`), as pip's `==3.20.0` would accept it.

    Args:
        installed: the version the env's metadata reports.
        pinned: the version after `==` in the lock.
    Returns:
        "ok", "wrong version" (the release differs) or "wrong build" (same release, other local version).
    """
    try:
        have, want = Version(installed), Version(pinned)
    except InvalidVersion:
        # Not PEP 440 (a hand-made install): nothing to parse, so only identical strings match.
        return "ok" if installed == pinned else "wrong version"
    if Version(have.public) != Version(want.public):
        return "wrong version"
    if want.local is not None and have.local != want.local:
        return "wrong build"
    return "ok"


def compare_to_lock(installed: dict[str, str], pins: dict[str, str]) -> Drift:
    """Sort every pinned and installed distribution into missing, wrong version, wrong build and extra.

    Args:
        installed: {distribution name: version} read from the env (any spelling of the names).
        pins: {distribution name: version} of the lock's `name==version` lines.
    Returns:
        a Drift, each kind sorted by name.
    """
    have = {canonicalize_name(k): v for k, v in installed.items()}
    want = {canonicalize_name(k): v for k, v in pins.items()}
    kinds: dict[str, list] = {"ok": [], "missing": [], "wrong version": [], "wrong build": []}
    for name, pinned in sorted(want.items()):
        version = have.get(name)
        if version is None:
            kinds["missing"].append((name, None, pinned))
            continue
        kinds[compare_versions(version, pinned)].append((name, version, pinned))
    extra = tuple((name, have[name], None) for name in sorted(set(have) - set(want) - _TOOLING))
    return Drift(tuple(kinds["missing"]), tuple(kinds["wrong version"]), tuple(kinds["wrong build"]), extra, len(kinds["ok"]))


def _listed(items: list[str]) -> str:
    more = f" (+{len(items) - _SHOWN} more)" if len(items) > _SHOWN else ""
    return ", ".join(items[:_SHOWN]) + more


def drift_verdict(host_name: str, env: str, drift: Drift, extras_matter: bool) -> Check:
    """The drift row of one host from a Drift.

    A missing package, another version or another build of a pinned package fails (exit 1): the env
    is no longer the one its lock names and whose manifest was verified. A package outside the lock
    warns (exit 0): every pinned package is still exactly what the lock says, so what was verified
    still holds, but someone installed into an env meant to be immutable and the extra can shadow or
    add behaviour (an entry point, a plugin); provision builds a fresh env without it.

    Args:
        host_name: the host's name (the row's scope).
        env: the env's path on the host, named in the detail.
        drift: what `compare_to_lock` found.
        extras_matter: whether the lock lists every package of the env (then an extra is drift).
    Returns:
        a Check named "drift": fail, warn or ok, its detail naming each package and both versions.
    """
    parts = []
    if drift.missing:
        parts.append("missing: " + _listed([f"{n} (lock pins {p})" for n, _, p in drift.missing]))
    if drift.wrong_version:
        parts.append("wrong version: " + _listed([f"{n} {h} installed, lock pins {p}" for n, h, p in drift.wrong_version]))
    if drift.wrong_build:
        parts.append("wrong build: " + _listed([f"{n} {h} installed, lock pins {p}" for n, h, p in drift.wrong_build]))
    extras = _listed([f"{n} {h}" for n, h, _ in drift.extra]) if extras_matter and drift.extra else ""
    if drift.differs:
        tail = f"; outside the lock: {extras}" if extras else ""
        return Check(host_name, "drift", "fail", f"{env} differs from its lock: " + "; ".join(parts) + tail)
    if extras:
        return Check(host_name, "drift", "warn", f"{env} has packages outside its lock: {extras}")
    return Check(host_name, "drift", "ok", f"{env}: {drift.matched} pinned packages match")


def drift_check(host: Host, env: str, lock, connect_timeout_s: int, transport: Transport = SSH) -> Check:
    """What the env on the host has that differs from its lock (missing, other versions or builds, extras)."""
    proc = transport.call(host, f"{shlex.quote(env + '/bin/python')} -c {shlex.quote(_LIST_DISTS)}", timeout_s=60, connect_timeout_s=connect_timeout_s)
    if proc.returncode != 0:
        return Check(host.name, "drift", "fail", f"cannot list {env}'s packages: {proc.stderr.strip()[-300:]}")
    pins = lock.pinned()
    # A reference lock lists every wheel the resolver downloaded, so the env holds exactly its pins and
    # an extra is drift. An sglang lock's pins are a constraints file: they bound versions but do not
    # enumerate the env, so extras say nothing (the lock says which through warns_on_extra_packages).
    extras_matter = bool(pins) and lock.warns_on_extra_packages
    return drift_verdict(host.name, env, compare_to_lock(json.loads(proc.stdout), pins), extras_matter)


# ---- the whole preflight ------------------------------------------------------------------------


def run_doctor(
    project: Project,
    hosts: list[Host],
    container_mode: bool | None = None,
    connect_timeout_s: int = 5,
    run_manifest: bool = True,
    transport: Transport = SSH,
    progress: Progress = silent,
) -> DoctorReport:
    """Control checks, then every host's checks in parallel (reported in the project's host order).

    Args:
        container_mode: check Docker here too (None: when engine.install.mode says so).
        transport: the SSH seam.
        progress: one line when the hosts' checks start, before each host's slow steps, and as each
            host finishes (with its counts and seconds), so a 10 s manifest run is not silent.
    Returns:
        the report (exit code 0 when nothing failed).
    """
    checks = control_checks(project, container_mode)
    if hosts:
        progress(f"doctor: checking {len(hosts)} host(s) in parallel (SSH connect timeout {connect_timeout_s}s)")

        def one(host: Host) -> list[Check]:
            started = time.monotonic()
            rows = host_checks(project, host, connect_timeout_s, run_manifest, transport, progress)
            counts = ", ".join(f"{n} {status}" for status in ("fail", "warn", "ok") if (n := sum(c.status == status for c in rows)))
            progress(f"doctor: {host.name}: done in {time.monotonic() - started:.1f}s ({counts})")
            return rows

        with ThreadPoolExecutor(max_workers=min(8, len(hosts))) as pool:
            per_host = list(pool.map(one, hosts))
        for host_rows in per_host:
            checks.extend(host_rows)
    return DoctorReport(tuple(checks))
