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

import json
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from ..config import DEFAULT_KNOWN_HOSTS_NAME, Host, SshSettings, parse_project
from ..exceptions import ConfigError, HostError
from ..hosts.known_hosts import HostKey, host_pattern, parse_key_line, write_atomically
from ..hosts.ssh import SSH, Transport
from .docker import docker, ensure_docker
from .identity import CONFIG_NAME, KEY_NAME, MARKER, MAX_HOSTS, Lab, host_name
from .objects import (
    address_of,
    ensure_container,
    ensure_network,
    index_of,
    inspect_object,
    lab_objects_elsewhere,
    labels_of,
    legacy_warning,
    own_containers,
    own_volumes,
    refuse_foreign,
    remove_container,
)
from .image import LAB_IMAGE, ensure_image


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


# Every lab host is a container on this one machine: an engine's torch would start one thread per core of
# the machine, so N hosts x 2 services would oversubscribe its cores N*2 times over and spin against each
# other (measured: healthcheck over 8 lab hosts 52 s with that, 3.5 s with one thread each, on 2 cores).
# Real hosts each have their own cores and GPU: this is the lab's setting only, in systemd's manager
# environment (the drop-in for boots, set-environment for now), so the units deploy writes stay as on real hosts.
LAB_THREADS_ENV = "OMP_NUM_THREADS=1"
LAB_SYSTEMD_DROP_IN = "/etc/systemd/system.conf.d/ddtree-lab-threads.conf"


def _share_cpus(container: str) -> None:
    docker(
        "exec", container, "sh", "-c",
        f"mkdir -p {LAB_SYSTEMD_DROP_IN.rsplit('/', 1)[0]} && "
        f"printf '[Manager]\\nDefaultEnvironment={LAB_THREADS_ENV}\\n' > {LAB_SYSTEMD_DROP_IN} && "
        f"systemctl set-environment {LAB_THREADS_ENV}",
    )  # fmt: skip


def host_keys_of(container: str) -> list[HostKey]:
    """The SSH host keys a lab container's sshd offers, read inside it (its /etc/ssh/ssh_host_*_key.pub).

    `docker exec` is the lab's out-of-band channel (a real fleet's is the console, or cloud-init's
    report): the keys come from the host itself, not from whoever answers on its address.
    """
    proc = docker("exec", container, "sh", "-c", "cat /etc/ssh/ssh_host_*_key.pub", check=False, timeout_s=30)
    keys = [HostKey(*line.split()[:2]) for line in proc.stdout.splitlines() if len(line.split()) >= 2]
    if proc.returncode != 0 or not keys:
        raise HostError(f"lab container {container}: no SSH host keys in /etc/ssh ({proc.stderr.strip() or 'none'})")
    return keys


def record_lab_host_keys(known_hosts: Path, keys: dict[str, list[HostKey]]) -> None:
    """Write the lab's known_hosts: exactly `keys` (address -> that host's keys), on port 22.

    The lab's file is the lab's own: it is rewritten whole on every `lab up`, so a recreated host (new
    keys) is re-recorded and a removed one forgotten; entries for any other address are kept.
    """
    patterns = {host_pattern(address, 22) for address in keys}
    kept = []
    if known_hosts.exists():
        for line in known_hosts.read_text().splitlines():
            parsed = parse_key_line(line)
            if parsed is None or not set(parsed[0].split(",")) & patterns:
                kept.append(line)
    lines = kept + [key.line(host_pattern(address, 22)) for address, host_keys in keys.items() for key in host_keys]
    write_atomically(known_hosts, "".join(line + "\n" for line in lines))


def ssh_answers(
    address: str, key: Path, timeout_s: int = 5, transport: Transport = SSH, known_hosts: Path | None = None
) -> bool:
    """Whether `ssh -i KEY root@ADDRESS true` succeeds from this machine (through the SSH seam), the host's
    key checked against `known_hosts` (default: the lab's, beside KEY)."""
    known_hosts = known_hosts if known_hosts is not None else key.parent / DEFAULT_KNOWN_HOSTS_NAME
    host = Host(name="lab-host", address=address, ssh=SshSettings(user="root", port=22, key=str(key))).bound_to(known_hosts)
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
        info = inspect_object(kind, name)
        if info is not None:
            refuse_foreign(lab, kind, name, info)

    warnings = [w for w in (_marker_warning(lab),) if w]
    lab.lab_dir.mkdir(parents=True, exist_ok=True)
    key = _ensure_key(lab)
    public_key = key.with_suffix(".pub").read_text()
    marker = {"made_by": "ddtree-ops lab up", "lab_id": lab.lab_id, "lab_dir": str(lab.lab_dir), "network": lab.network}
    (lab.lab_dir / MARKER).write_text(json.dumps(marker) + "\n")

    ensure_network(lab)
    wanted = {lab.container(i) for i in range(1, n_hosts + 1)}
    for extra in sorted(set(own_containers(lab)) - wanted):
        remove_container(lab, extra)
    for i in range(1, n_hosts + 1):
        ensure_container(lab, i)

    addresses: dict[str, str] = {}
    host_keys: dict[str, list[HostKey]] = {}
    for i in range(1, n_hosts + 1):
        name = lab.container(i)
        _wait_for_systemd(name)
        _install_key(name, public_key)
        _share_cpus(name)
        address = address_of(lab, inspect_object("container", name) or {})
        if not address:
            raise HostError(f"lab container {name} has no address on network {lab.network}")
        addresses[host_name(i)] = address
        host_keys[address] = host_keys_of(name)
    # Recorded before the first SSH connection: from here on the lab's hosts are checked like any other.
    record_lab_host_keys(lab.lab_dir / DEFAULT_KNOWN_HOSTS_NAME, host_keys)
    for host, address in addresses.items():
        _wait_for_ssh(host, address, key)

    document = lab_project(addresses, key)
    config_path = lab.lab_dir / CONFIG_NAME
    # The file we write must pass the same validation; its hosts' keys are in `known_hosts` beside it.
    parse_project(document, "the lab's ddtree.yaml", config_path)
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
    for container in own_containers(lab):
        info = inspect_object("container", container)
        if info is None:
            continue
        running = bool(info["State"]["Running"])
        address = address_of(lab, info)
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
    hosts.sort(key=lambda h: index_of(lab, h.container) or 0)
    others, legacy = lab_objects_elsewhere(lab)
    config_path = lab.lab_dir / CONFIG_NAME
    return LabReport(
        lab_dir=str(lab.lab_dir),
        lab_id=lab.lab_id,
        network=lab.network,
        config_path=str(config_path) if config_path.exists() else None,
        image=LAB_IMAGE,
        hosts=hosts,
        other_labs=others,
        warnings=[w for w in (legacy_warning(legacy),) if w],
    )


def down(lab_dir: Path | None = None) -> LabDownReport:
    """Remove this lab's containers, volumes and network, and the lab directory (if `up` made it).

    Args:
        lab_dir: the lab directory (default `default_lab_dir()`).

    Returns:
        What was removed, and warnings about old-style objects (left alone). Other labs are not
        touched; the image stays, so the next `up` is quick.
    """
    lab = Lab.at(lab_dir)
    ensure_docker()
    removed: list[str] = []
    containers = own_containers(lab)
    if containers:
        docker("rm", "-f", *containers)
        removed += containers
    for volume in own_volumes(lab):
        docker("volume", "rm", "-f", volume)
        removed.append(f"volume {volume}")
    network = inspect_object("network", lab.network)
    if network is not None and lab.owns(labels_of("network", network)):
        docker("network", "rm", lab.network)
        removed.append(f"network {lab.network}")
    if (lab.lab_dir / MARKER).exists():
        shutil.rmtree(lab.lab_dir)
        removed.append(str(lab.lab_dir))
    _, legacy = lab_objects_elsewhere(lab)
    return LabDownReport(
        lab_dir=str(lab.lab_dir),
        lab_id=lab.lab_id,
        removed=removed,
        warnings=[w for w in (legacy_warning(legacy),) if w],
    )
