"""The local lab fleet: N Docker containers that behave like small bare-metal hosts (systemd + sshd).

One lab per directory. A lab's id comes from its directory's resolved path (`lab_id`), and every
Docker object it makes carries it: containers `ddtree-lab-<id>-N`, network `ddtree-lab-<id>`,
volumes `ddtree-lab-<id>-N-docker`, each labelled `ddtree.lab.id=<id>` and `ddtree.lab.dir=<dir>`.
Every query filters on those labels, so `up`, `down` and `status` never see, stop, remove or
re-key another lab's objects; an object that has one of this lab's names but another's labels
makes `up` stop and say so.

`up` is safe to re-run (running containers are reused, the key is re-installed), `down` removes
what `up` made (containers, network, volumes, lab directory; the image stays cached), `status` looks.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from ..config import parse_project
from ..exceptions import ConfigError, HostError
from .docker import docker, ensure_docker
from .image import LAB_IMAGE, ensure_image

LAB_DIR_ENV = "DDTREE_LAB_DIR"
NAME_PREFIX = "ddtree-lab"
LABEL = "ddtree.lab"  # on every lab object, old and new: "made by ddtree-ops lab"
LABEL_ID = "ddtree.lab.id"  # which lab: the id `lab_id` derives from its directory
LABEL_DIR = "ddtree.lab.dir"  # which lab, readable (and it tells two directories apart if ids ever collide)
# Before labs were per directory, every lab used these global names (and only the LABEL label).
LEGACY_NETWORK = "ddtree-lab"
MARKER = "lab.json"  # written into the lab dir; `down` only deletes directories that carry it
KEY_NAME = "id_ed25519"
CONFIG_NAME = "ddtree.yaml"
MAX_HOSTS = 16

# systemd as PID 1 without --privileged: it needs to manage cgroups and mount tmpfs on /run.
# NET_ADMIN and no AppArmor profile let a host run its own Docker Engine (container mode).
RUN_FLAGS = [
    "--cap-add", "SYS_ADMIN",
    "--cap-add", "NET_ADMIN",
    "--security-opt", "seccomp=unconfined",
    "--security-opt", "apparmor=unconfined",
    "--cgroupns=host",
    "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--tmpfs", "/run",
    "--tmpfs", "/run/lock",
    "--tmpfs", "/tmp",
]  # fmt: skip


def default_lab_dir() -> Path:
    if os.environ.get(LAB_DIR_ENV):
        return Path(os.environ[LAB_DIR_ENV])
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local/share")
    return Path(base) / "ddtree-ops" / "lab"


def lab_id(lab_dir: str | os.PathLike) -> str:
    """The lab's id: a readable prefix from the directory's name plus a hash of its resolved path.

    Args:
        lab_dir: the lab directory (need not exist yet).

    Returns:
        `<name>-<8 hex>`, e.g. `main-1f0c9a3e` for `/work/main/.lab`: stable for a path, different
        for two paths, and valid in Docker object names.
    """
    resolved = Path(lab_dir).expanduser().resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:8]
    name = resolved.name.lstrip(".")
    if name.lower() in ("", "lab"):
        # `.lab`, `…/ddtree-ops/lab`: the parent's name says more than "lab" would, twice, in `ddtree-lab-lab-…`
        name = resolved.parent.name.lstrip(".")
    readable = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:16].strip("-") or "lab"
    return f"{readable}-{digest}"


@dataclass(frozen=True)
class Lab:
    """One lab directory and the names of the Docker objects it owns."""

    lab_dir: Path  # resolved
    lab_id: str

    @classmethod
    def at(cls, lab_dir: str | os.PathLike | None) -> Lab:
        resolved = Path(lab_dir if lab_dir else default_lab_dir()).expanduser().resolve()
        return cls(resolved, lab_id(resolved))

    @property
    def network(self) -> str:
        return f"{NAME_PREFIX}-{self.lab_id}"

    def container(self, index: int) -> str:
        return f"{NAME_PREFIX}-{self.lab_id}-{index}"

    def volume(self, index: int) -> str:
        """The host's /var/lib/docker: a volume, because overlay2 cannot stack on the container's own overlay."""
        return f"{NAME_PREFIX}-{self.lab_id}-{index}-docker"

    def label_args(self) -> list[str]:
        return ["--label", LABEL, "--label", f"{LABEL_ID}={self.lab_id}", "--label", f"{LABEL_DIR}={self.lab_dir}"]

    def filter_args(self) -> list[str]:
        # Both labels: a container of another directory whose id happened to collide is still not ours.
        return ["--filter", f"label={LABEL_ID}={self.lab_id}", "--filter", f"label={LABEL_DIR}={self.lab_dir}"]

    def owns(self, labels: dict | None) -> bool:
        labels = labels or {}
        return labels.get(LABEL_ID) == self.lab_id and labels.get(LABEL_DIR) == str(self.lab_dir)


def host_name(index: int) -> str:
    return f"lab-{index}"


@dataclass
class LabHost:
    name: str  # also the container's hostname
    container: str
    address: str | None
    state: str  # docker's: running, exited, …
    systemd: str  # `systemctl is-system-running`: running, degraded, starting, … or "-"
    ssh: bool


@dataclass
class LabReport:
    lab_dir: str
    lab_id: str
    network: str
    config_path: str | None
    image: str
    hosts: list[LabHost]
    timings_s: dict[str, float] = field(default_factory=dict)
    # Other labs on this daemon, by directory (never their hosts), and what to do about old-style objects.
    other_labs: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class LabDownReport:
    lab_dir: str
    lab_id: str
    removed: list[str]
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _own_containers(lab: Lab) -> list[str]:
    out = docker("ps", "-a", *lab.filter_args(), "--format", "{{.Names}}").stdout
    return sorted(n for n in out.split() if n)


def _own_volumes(lab: Lab) -> list[str]:
    out = docker("volume", "ls", "-q", *lab.filter_args()).stdout
    return sorted(v for v in out.split() if v)


def _index_of(lab: Lab, container: str) -> int | None:
    tail = container.removeprefix(f"{lab.network}-")
    return int(tail) if tail.isdigit() else None


def _inspect(kind: str, name: str) -> dict | None:
    proc = docker(kind, "inspect", name, check=False)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)[0]


def _labels_of(kind: str, info: dict) -> dict:
    if kind == "container":
        return (info.get("Config") or {}).get("Labels") or {}
    return info.get("Labels") or {}


def _refuse_foreign(lab: Lab, kind: str, name: str, info: dict) -> None:
    """Stop when NAME exists but is not this lab's: another lab's, an old-style one, or not a lab's at all."""
    labels = _labels_of(kind, info)
    if lab.owns(labels):
        return
    if labels.get(LABEL_ID):
        owner = f"the lab in {labels.get(LABEL_DIR) or '?'} (id {labels[LABEL_ID]})"
    elif LABEL in labels:
        owner = "a lab made before labs were per directory"
    else:
        owner = "something other than ddtree-ops lab"
    remove = {"container": "docker rm -f", "network": "docker network rm", "volume": "docker volume rm"}[kind]
    raise HostError(
        f"the {kind} {name} belongs to {owner}, not to the lab in {lab.lab_dir}: ddtree-ops leaves it alone. "
        f"If it is stale, remove it yourself (`{remove} {name}`); otherwise use another --dir"
    )


def _address(lab: Lab, info: dict) -> str | None:
    net = (info.get("NetworkSettings", {}).get("Networks") or {}).get(lab.network) or {}
    return net.get("IPAddress") or None


def _ensure_network(lab: Lab) -> None:
    info = _inspect("network", lab.network)
    if info is not None:
        _refuse_foreign(lab, "network", lab.network, info)
        return
    # No --subnet: Docker's IPAM takes a free one from its address pools, so two labs never overlap.
    docker("network", "create", *lab.label_args(), lab.network)


def _remove_container(lab: Lab, name: str) -> list[str]:
    docker("rm", "-f", name)
    removed = [name]
    index = _index_of(lab, name)
    if index is not None and _inspect("volume", lab.volume(index)) is not None:
        docker("volume", "rm", "-f", lab.volume(index))
        removed.append(f"volume {lab.volume(index)}")
    return removed


def _ensure_container(lab: Lab, index: int) -> None:
    name = lab.container(index)
    info = _inspect("container", name)
    if info is not None:
        _refuse_foreign(lab, "container", name, info)
    if info is not None and (info.get("Config") or {}).get("Image") != LAB_IMAGE:
        docker("rm", "-f", name)  # made from an older lab image: hosts must look like the current one
        info = None
    if info is not None and info["State"]["Running"]:
        return
    if info is not None:
        docker("start", name)
        return
    volume = _inspect("volume", lab.volume(index))
    if volume is not None:
        _refuse_foreign(lab, "volume", lab.volume(index), volume)
    else:
        docker("volume", "create", *lab.label_args(), lab.volume(index))
    docker(
        "run", "-d", "--name", name, "--hostname", host_name(index), "--network", lab.network,
        *lab.label_args(), *RUN_FLAGS, "-v", f"{lab.volume(index)}:/var/lib/docker", LAB_IMAGE,
    )  # fmt: skip


def _lab_objects_elsewhere(lab: Lab) -> tuple[list[str], dict[str, list[str]]]:
    """What other labs left on this daemon, for messages only (never acted on).

    Returns (other labs' directories, old-style objects by kind: container/network/volume names).
    """
    others: set[str] = set()
    legacy: dict[str, list[str]] = {"container": [], "network": [], "volume": []}
    listings = {
        "container": ["ps", "-a", "--format"],
        "network": ["network", "ls", "--format"],
        "volume": ["volume", "ls", "--format"],
    }
    for kind, argv in listings.items():
        name_field = "{{.Names}}" if kind == "container" else "{{.Name}}"
        fmt = f'{name_field}\t{{{{.Label "{LABEL_ID}"}}}}\t{{{{.Label "{LABEL_DIR}"}}}}'
        out = docker(*argv[:-1], "--filter", f"label={LABEL}", argv[-1], fmt).stdout
        for line in out.splitlines():
            name, owner_id, owner_dir = (line.split("\t") + ["", ""])[:3]
            if not name:
                continue
            if not owner_id:
                legacy[kind].append(name)
            elif owner_id != lab.lab_id or owner_dir != str(lab.lab_dir):
                others.add(owner_dir or owner_id)
    return sorted(others), {k: sorted(v) for k, v in legacy.items()}


def _legacy_warning(legacy: dict[str, list[str]]) -> str | None:
    if not any(legacy.values()):
        return None
    listed = "; ".join(f"{kind}{'s' if len(names) > 1 else ''} {', '.join(names)}" for kind, names in legacy.items() if names)
    commands = []
    if legacy["container"]:
        commands.append("docker rm -f " + " ".join(legacy["container"]))
    if legacy["volume"]:
        commands.append("docker volume rm " + " ".join(legacy["volume"]))
    if legacy["network"]:
        commands.append("docker network rm " + " ".join(legacy["network"]))
    return (
        f"old-style lab objects (from before labs were per directory) are on this Docker daemon: {listed}. "
        "ddtree-ops leaves them alone: their names were shared by every lab directory, so nothing says whose "
        "they are. If they are yours and no longer used, remove them with: " + " && ".join(commands)
    )


def _systemd_state(container: str) -> str:
    proc = docker("exec", container, "systemctl", "is-system-running", check=False, timeout_s=30)
    return proc.stdout.strip() or proc.stderr.strip() or "-"


def _wait_for_systemd(container: str, timeout_s: float = 90) -> str:
    deadline = time.monotonic() + timeout_s
    state = "-"
    while time.monotonic() < deadline:
        state = _systemd_state(container)
        if state in ("running", "degraded"):
            return state
        time.sleep(0.5)
    raise HostError(f"lab container {container}: systemd did not finish booting within {timeout_s:.0f}s (state {state!r})")


def _ensure_key(lab: Lab) -> Path:
    key = lab.lab_dir / KEY_NAME
    if not key.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"ddtree-lab-{lab.lab_id}", "-f", str(key)],
            check=True,
        )
    return key


def _install_key(container: str, public_key: str) -> None:
    # The lab's bootstrap: docker exec stands in for the cloud-init / PXE step of a real fleet.
    docker(
        "exec", "-i", container, "sh", "-c",
        "mkdir -p /root/.ssh && chmod 700 /root/.ssh && cat > /root/.ssh/authorized_keys "
        "&& chmod 600 /root/.ssh/authorized_keys",
        input_text=public_key,
    )  # fmt: skip


def ssh_answers(address: str, key: Path, timeout_s: int = 5) -> bool:
    """Whether `ssh -i KEY root@ADDRESS true` succeeds from this machine."""
    argv = [
        "ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
        "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", f"ConnectTimeout={timeout_s}",
        f"root@{address}", "true",
    ]  # fmt: skip
    try:
        return subprocess.run(argv, capture_output=True, timeout=timeout_s + 5, check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _wait_for_ssh(name: str, address: str, key: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ssh_answers(address, key):
            return
        time.sleep(0.5)
    raise HostError(
        f"lab host {name} ({address}:22) does not answer SSH within {timeout_s:.0f}s; "
        f"try `ssh -i {key} root@{address}` and `docker logs {name}`"
    )


def lab_project(addresses: dict[str, str], key: Path) -> dict:
    """The lab's project file: the reference backend on the engine's `lab` model pair, two services per host."""
    return {
        "version": 1,
        "hosts": [
            {"name": name, "address": address, "ssh": {"user": "root", "port": 22, "key": str(key)}}
            for name, address in addresses.items()
        ],
        "engine": {
            "backend": "reference",
            "target": "lab",
            "draft": "lab",
            "block_size": 16,
            "device": "cpu",
        },
        "services": [
            {"name": "baseline", "algorithm": "dflash", "port": 30000},
            {"name": "tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "port": 30001},
        ],
    }


def _marker_warning(lab: Lab) -> str | None:
    """A lab.json naming another lab: this directory was moved or copied from where that lab was made."""
    marker = lab.lab_dir / MARKER
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    if recorded.get("lab_id") and recorded["lab_id"] != lab.lab_id:
        return (
            f"{marker} was written for the lab {recorded['lab_id']} in {recorded.get('lab_dir', '?')} "
            f"(this directory was moved or copied); this directory's lab is {lab.lab_id}, and that lab's "
            f"containers are left alone (`ddtree-ops lab down --dir {recorded.get('lab_dir', '…')}` removes them)"
        )
    return None


def up(n_hosts: int = 2, lab_dir: Path | None = None) -> LabReport:
    """Start (or reuse) this lab's hosts lab-1..lab-N and write the lab's ddtree.yaml.

    Args:
        n_hosts: how many hosts (1..MAX_HOSTS); this lab's containers beyond N are removed.
        lab_dir: the lab directory (default `default_lab_dir()`); it names the lab.

    Returns:
        The lab's status after start-up, with timings and warnings (old-style objects, a moved lab.json).

    Raises:
        ConfigError: N out of range.
        DockerUnavailable: no Docker engine could be started.
        HostError: a host did not boot or does not answer SSH, or one of this lab's names is taken by
            an object that is not this lab's (it is left untouched).
    """
    if not 1 <= n_hosts <= MAX_HOSTS:
        raise ConfigError(f"--hosts must be between 1 and {MAX_HOSTS}, got {n_hosts}")
    lab = Lab.at(lab_dir)
    timings: dict[str, float] = {}
    started = time.monotonic()
    ensure_docker()
    timings["image_build"] = round(ensure_image(), 1)

    # Check every name before changing anything: a foreign object stops `up` with nothing touched.
    names = [("network", lab.network)]
    for i in range(1, n_hosts + 1):
        names += [("container", lab.container(i)), ("volume", lab.volume(i))]
    for kind, name in names:
        info = _inspect(kind, name)
        if info is not None:
            _refuse_foreign(lab, kind, name, info)

    warnings = [w for w in (_marker_warning(lab),) if w]
    lab.lab_dir.mkdir(parents=True, exist_ok=True)
    key = _ensure_key(lab)
    public_key = key.with_suffix(".pub").read_text()
    marker = {"made_by": "ddtree-ops lab up", "lab_id": lab.lab_id, "lab_dir": str(lab.lab_dir), "network": lab.network}
    (lab.lab_dir / MARKER).write_text(json.dumps(marker) + "\n")

    _ensure_network(lab)
    wanted = {lab.container(i) for i in range(1, n_hosts + 1)}
    for extra in sorted(set(_own_containers(lab)) - wanted):
        _remove_container(lab, extra)
    for i in range(1, n_hosts + 1):
        _ensure_container(lab, i)

    addresses: dict[str, str] = {}
    for i in range(1, n_hosts + 1):
        name = lab.container(i)
        _wait_for_systemd(name)
        _install_key(name, public_key)
        address = _address(lab, _inspect("container", name) or {})
        if not address:
            raise HostError(f"lab container {name} has no address on network {lab.network}")
        addresses[host_name(i)] = address
    for host, address in addresses.items():
        _wait_for_ssh(host, address, key)

    document = lab_project(addresses, key)
    parse_project(document, "the lab's ddtree.yaml")  # the file we write must pass the same validation
    config_path = lab.lab_dir / CONFIG_NAME
    header = f"# Written by `ddtree-ops lab up` for the lab {lab.lab_id}; rewritten on every `lab up`. Use it with:\n"
    header += f"#   export DDTREE_CONFIG={config_path}\n"
    config_path.write_text(header + yaml.safe_dump(document, sort_keys=False))
    timings["lab_up"] = round(time.monotonic() - started, 1)

    report = status(lab.lab_dir)
    report.timings_s = timings
    report.warnings = warnings + report.warnings
    return report


def status(lab_dir: Path | None = None) -> LabReport:
    """What this lab looks like now: each of its containers, address, systemd state and SSH reachability.

    Args:
        lab_dir: the lab directory (default `default_lab_dir()`).

    Returns:
        This lab's hosts only (none when no lab runs here); `other_labs` names other labs' directories
        and `warnings` old-style objects, but never their hosts.
    """
    lab = Lab.at(lab_dir)
    ensure_docker()
    key = lab.lab_dir / KEY_NAME
    hosts = []
    for container in _own_containers(lab):
        info = _inspect("container", container)
        if info is None:
            continue
        running = bool(info["State"]["Running"])
        address = _address(lab, info)
        hosts.append(
            LabHost(
                name=(info.get("Config") or {}).get("Hostname") or container,
                container=container,
                address=address,
                state=info["State"]["Status"],
                systemd=_systemd_state(container) if running else "-",
                ssh=bool(running and address and key.exists() and ssh_answers(address, key)),
            )
        )
    hosts.sort(key=lambda h: _index_of(lab, h.container) or 0)
    others, legacy = _lab_objects_elsewhere(lab)
    config_path = lab.lab_dir / CONFIG_NAME
    return LabReport(
        lab_dir=str(lab.lab_dir),
        lab_id=lab.lab_id,
        network=lab.network,
        config_path=str(config_path) if config_path.exists() else None,
        image=LAB_IMAGE,
        hosts=hosts,
        other_labs=others,
        warnings=[w for w in (_legacy_warning(legacy),) if w],
    )


def down(lab_dir: Path | None = None) -> LabDownReport:
    """Remove this lab's containers, volumes and network, and the lab directory (if `up` made it).

    Args:
        lab_dir: the lab directory (default `default_lab_dir()`).

    Returns:
        What was removed, and warnings about old-style objects (left alone). Other labs are not
        touched; the image stays, so the next `up` is quick.
    """
    import shutil

    lab = Lab.at(lab_dir)
    ensure_docker()
    removed: list[str] = []
    containers = _own_containers(lab)
    if containers:
        docker("rm", "-f", *containers)
        removed += containers
    for volume in _own_volumes(lab):
        docker("volume", "rm", "-f", volume)
        removed.append(f"volume {volume}")
    network = _inspect("network", lab.network)
    if network is not None and lab.owns(_labels_of("network", network)):
        docker("network", "rm", lab.network)
        removed.append(f"network {lab.network}")
    if (lab.lab_dir / MARKER).exists():
        shutil.rmtree(lab.lab_dir)
        removed.append(str(lab.lab_dir))
    _, legacy = _lab_objects_elsewhere(lab)
    return LabDownReport(
        lab_dir=str(lab.lab_dir),
        lab_id=lab.lab_id,
        removed=removed,
        warnings=[w for w in (_legacy_warning(legacy),) if w],
    )
