"""Which lab a directory is: its id, and the names and labels of the Docker objects it owns."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

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
