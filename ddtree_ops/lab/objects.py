"""A lab's Docker objects: finding its own (by label), refusing another's, creating and removing them."""

from __future__ import annotations

import json

from ..exceptions import HostError
from .docker import docker
from .identity import LABEL, LABEL_DIR, LABEL_ID, RUN_FLAGS, Lab, host_name
from .image import LAB_IMAGE


def own_containers(lab: Lab) -> list[str]:
    out = docker("ps", "-a", *lab.filter_args(), "--format", "{{.Names}}").stdout
    return sorted(n for n in out.split() if n)


def own_volumes(lab: Lab) -> list[str]:
    out = docker("volume", "ls", "-q", *lab.filter_args()).stdout
    return sorted(v for v in out.split() if v)


def index_of(lab: Lab, container: str) -> int | None:
    tail = container.removeprefix(f"{lab.network}-")
    return int(tail) if tail.isdigit() else None


def inspect_object(kind: str, name: str) -> dict | None:
    proc = docker(kind, "inspect", name, check=False)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)[0]


def labels_of(kind: str, info: dict) -> dict:
    if kind == "container":
        return (info.get("Config") or {}).get("Labels") or {}
    return info.get("Labels") or {}


def refuse_foreign(lab: Lab, kind: str, name: str, info: dict) -> None:
    """Stop when NAME exists but is not this lab's: another lab's, an old-style one, or not a lab's at all."""
    labels = labels_of(kind, info)
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


def address_of(lab: Lab, info: dict) -> str | None:
    net = (info.get("NetworkSettings", {}).get("Networks") or {}).get(lab.network) or {}
    return net.get("IPAddress") or None


def ensure_network(lab: Lab) -> None:
    info = inspect_object("network", lab.network)
    if info is not None:
        refuse_foreign(lab, "network", lab.network, info)
        return
    # No --subnet: Docker's IPAM takes a free one from its address pools, so two labs never overlap.
    docker("network", "create", *lab.label_args(), lab.network)


def remove_container(lab: Lab, name: str) -> list[str]:
    docker("rm", "-f", name)
    removed = [name]
    index = index_of(lab, name)
    if index is not None and inspect_object("volume", lab.volume(index)) is not None:
        docker("volume", "rm", "-f", lab.volume(index))
        removed.append(f"volume {lab.volume(index)}")
    return removed


def ensure_container(lab: Lab, index: int) -> None:
    name = lab.container(index)
    info = inspect_object("container", name)
    if info is not None:
        refuse_foreign(lab, "container", name, info)
    if info is not None and (info.get("Config") or {}).get("Image") != LAB_IMAGE:
        docker("rm", "-f", name)  # made from an older lab image: hosts must look like the current one
        info = None
    if info is not None and info["State"]["Running"]:
        return
    if info is not None:
        docker("start", name)
        return
    volume = inspect_object("volume", lab.volume(index))
    if volume is not None:
        refuse_foreign(lab, "volume", lab.volume(index), volume)
    else:
        docker("volume", "create", *lab.label_args(), lab.volume(index))
    docker(
        "run", "-d", "--name", name, "--hostname", host_name(index), "--network", lab.network,
        *lab.label_args(), *RUN_FLAGS, "-v", f"{lab.volume(index)}:/var/lib/docker", LAB_IMAGE,
    )  # fmt: skip


def lab_objects_elsewhere(lab: Lab) -> tuple[list[str], dict[str, list[str]]]:
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


def legacy_warning(legacy: dict[str, list[str]]) -> str | None:
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
