"""The local lab fleet: N Docker containers running systemd (PID 1) and sshd, reached over SSH.

`up` is safe to re-run (running containers are reused, the key is re-installed), `down` removes
what `up` made (containers, network, lab directory; the image stays cached), `status` looks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from ..config import Host, SshSettings, parse_project
from ..exceptions import ConfigError, HostError
from ..hosts.ssh import SSH, Transport
from .docker import docker, ensure_docker
from .image import LAB_IMAGE, ensure_image

LAB_DIR_ENV = "DDTREE_LAB_DIR"
NETWORK = "ddtree-lab"
LABEL = "ddtree.lab"
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
    config_path: str | None
    image: str
    hosts: list[LabHost]
    timings_s: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def container_name(index: int) -> str:
    return f"ddtree-lab-{index}"


def host_name(index: int) -> str:
    return f"lab-{index}"


def docker_volume(index: int) -> str:
    """The host's /var/lib/docker: a volume, because overlay2 cannot stack on the container's own overlay."""
    return f"ddtree-lab-{index}-docker"


def _lab_containers() -> list[str]:
    out = docker("ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}").stdout
    return sorted(n for n in out.split() if n)


def _inspect(container: str) -> dict | None:
    proc = docker("inspect", container, check=False)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)[0]


def _address(info: dict) -> str | None:
    net = (info.get("NetworkSettings", {}).get("Networks") or {}).get(NETWORK) or {}
    return net.get("IPAddress") or None


def _ensure_network() -> None:
    if docker("network", "inspect", NETWORK, check=False).returncode != 0:
        docker("network", "create", "--label", LABEL, NETWORK)


def _ensure_container(index: int) -> None:
    name = container_name(index)
    info = _inspect(name)
    if info is not None and (info.get("Config") or {}).get("Image") != LAB_IMAGE:
        docker("rm", "-f", name)  # made from an older lab image: hosts must look like the current one
        info = None
    if info is not None and info["State"]["Running"]:
        return
    if info is not None:
        docker("start", name)
        return
    docker("volume", "create", "--label", LABEL, docker_volume(index))
    docker(
        "run", "-d", "--name", name, "--hostname", host_name(index), "--network", NETWORK,
        "--label", LABEL, *RUN_FLAGS, "-v", f"{docker_volume(index)}:/var/lib/docker", LAB_IMAGE,
    )  # fmt: skip


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


def _ensure_key(lab_dir: Path) -> Path:
    key = lab_dir / KEY_NAME
    if not key.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ddtree-lab", "-f", str(key)], check=True
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


def ssh_answers(address: str, key: Path, timeout_s: int = 5, transport: Transport = SSH) -> bool:
    """Whether `ssh -i KEY root@ADDRESS true` succeeds from this machine (through the SSH seam)."""
    host = Host(name="lab-host", address=address, ssh=SshSettings(user="root", port=22, key=str(key)))
    try:
        return transport.call(host, "true", timeout_s=timeout_s + 5, connect_timeout_s=timeout_s).returncode == 0
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


def up(n_hosts: int = 2, lab_dir: Path | None = None) -> LabReport:
    """Start (or reuse) lab hosts lab-1..lab-N and write the lab's ddtree.yaml.

    Raises:
        ConfigError: N out of range.
        DockerUnavailable: no Docker engine could be started.
        HostError: a host did not boot or does not answer SSH.
    """
    if not 1 <= n_hosts <= MAX_HOSTS:
        raise ConfigError(f"--hosts must be between 1 and {MAX_HOSTS}, got {n_hosts}")
    lab_dir = Path(lab_dir) if lab_dir else default_lab_dir()
    timings: dict[str, float] = {}
    started = time.monotonic()
    ensure_docker()
    timings["image_build"] = round(ensure_image(), 1)

    lab_dir.mkdir(parents=True, exist_ok=True)
    (lab_dir / MARKER).write_text(json.dumps({"made_by": "ddtree-ops lab up", "network": NETWORK}) + "\n")
    key = _ensure_key(lab_dir)
    public_key = key.with_suffix(".pub").read_text()

    _ensure_network()
    wanted = {container_name(i) for i in range(1, n_hosts + 1)}
    for extra in set(_lab_containers()) - wanted:
        docker("rm", "-f", extra)
    for i in range(1, n_hosts + 1):
        _ensure_container(i)

    addresses: dict[str, str] = {}
    for i in range(1, n_hosts + 1):
        name = container_name(i)
        _wait_for_systemd(name)
        _install_key(name, public_key)
        info = _inspect(name)
        address = _address(info or {})
        if not address:
            raise HostError(f"lab container {name} has no address on network {NETWORK}")
        addresses[host_name(i)] = address
    for host, address in addresses.items():
        _wait_for_ssh(host, address, key)

    document = lab_project(addresses, key)
    parse_project(document, "the lab's ddtree.yaml")  # the file we write must pass the same validation
    config_path = lab_dir / CONFIG_NAME
    header = "# Written by `ddtree-ops lab up`; rewritten on every `lab up`. Use it with:\n"
    header += f"#   export DDTREE_CONFIG={config_path}\n"
    config_path.write_text(header + yaml.safe_dump(document, sort_keys=False))
    timings["lab_up"] = round(time.monotonic() - started, 1)

    report = status(lab_dir)
    report.timings_s = timings
    return report


def status(lab_dir: Path | None = None) -> LabReport:
    """What the lab looks like now: each container, its address, systemd state and SSH reachability."""
    lab_dir = Path(lab_dir) if lab_dir else default_lab_dir()
    ensure_docker()
    key = lab_dir / KEY_NAME
    hosts = []
    for container in _lab_containers():
        info = _inspect(container)
        if info is None:
            continue
        running = bool(info["State"]["Running"])
        address = _address(info)
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
    hosts.sort(key=lambda h: int(h.container.rsplit("-", 1)[-1]) if h.container.rsplit("-", 1)[-1].isdigit() else 0)
    config_path = lab_dir / CONFIG_NAME
    return LabReport(
        lab_dir=str(lab_dir),
        config_path=str(config_path) if config_path.exists() else None,
        image=LAB_IMAGE,
        hosts=hosts,
    )


def down(lab_dir: Path | None = None) -> list[str]:
    """Remove the lab's containers, its network and the lab directory (if `up` made it).

    Returns the names of what was removed. The image stays, so the next `up` is quick.
    """
    lab_dir = Path(lab_dir) if lab_dir else default_lab_dir()
    ensure_docker()
    removed = []
    containers = _lab_containers()
    if containers:
        docker("rm", "-f", *containers)
        removed += containers
    volumes = [v for v in docker("volume", "ls", "-q", "--filter", f"label={LABEL}").stdout.split() if v]
    for volume in volumes:
        docker("volume", "rm", "-f", volume)
        removed.append(f"volume {volume}")
    if docker("network", "inspect", NETWORK, check=False).returncode == 0:
        docker("network", "rm", NETWORK)
        removed.append(f"network {NETWORK}")
    if (lab_dir / MARKER).exists():
        shutil.rmtree(lab_dir)
        removed.append(str(lab_dir))
    return removed
