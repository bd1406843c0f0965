"""The lock: exactly what one host's engine environment contains, and its hash (the env's name).

`EngineLock` is the one interface every lock implements — what to download (`ensure_wheelhouse`),
how to install it (`install_commands`), what to check (`manifest_args`, `pinned`), and how it is
shown (`plan_rows`, `describe`). Backend-specific behaviour lives in the two implementations:
`Lock` here (the reference backend, a CPU lock) and `CudaLock` (cuda_lock.py, the sglang backend).

`resolve_lock(project, host, facts)` is the seam between host facts and what gets installed for the
reference backend. The sglang backend's CUDA-ABI resolution (driver, GPU architecture, CUDA
flavour, kernel wheels) is `ddtree_ops.provision.resolve.resolve`, from the host's probe.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import Host, Project
from ..exceptions import ConfigError
from . import install, wheelhouse
from .engine_source import engine_source_digest, engine_source_dir
from .manifest import lock_pins, manifest_args
from .versions import python_tag as python_tag_of

# The hosts this resolver supports: glibc ≥ 2.28 on x86_64 (Debian 10+, Ubuntu 20.04+, RHEL 8+).
REFERENCE_PLATFORM = "manylinux_2_28_x86_64"
SHORT_HASH_LEN = 16
SGLANG_FROM_PROBE = (
    "resolve_lock makes reference locks from Ansible's facts; an sglang lock needs the host's probe "
    "(driver, GPUs): use ddtree_ops.provision.resolve.resolve, as provision does"
)
CPU_FLAVOUR = "cpu"


class EngineLock(ABC):
    """What every lock answers. Implementations: `Lock` (reference) and `CudaLock` (sglang)."""

    backend: str
    python_tag: str  # "cp311": the env's interpreter
    platform: str  # the wheel platform tag the wheelhouse is built for
    engine_source: str  # sha256 of the engine's sources: a code change is a new environment
    requirements: tuple[str, ...]  # every pinned `name==version` line (what the manifest checks the env against)
    # Shown beside the plan, never part of the env's identity; a lock with blockers can be planned, not installed.
    warnings: tuple[str, ...] = ()
    blockers: tuple[str, ...] = ()
    gpu_archs: tuple[str, ...] = ()  # the GPU architectures the env was resolved for (none: CPU)
    warns_on_extra_packages = False  # doctor: packages outside the lock are a warning (not for sglang's closure)

    @property
    @abstractmethod
    def hash(self) -> str:
        """sha256 of everything that decides what the env contains."""

    @property
    def short_hash(self) -> str:
        """The env's directory name: /opt/ddtree/envs/<short_hash>."""
        return self.hash[:SHORT_HASH_LEN]

    @abstractmethod
    def requirements_text(self) -> str:
        """The file the wheelhouse carries (requirements.txt or constraints.txt)."""

    @abstractmethod
    def to_dict(self) -> dict:
        """The lock as JSON (lock.json, `provision --plan --json`)."""

    # --- what to download ---------------------------------------------------------------------

    def install_source(self, configured: str) -> str:
        """Where this lock's wheels come from, given `engine.install.source`."""
        return configured

    @abstractmethod
    def ensure_wheelhouse(self, engine_dir: Path, source: str) -> Path:
        """Build (or reuse) this lock's wheelhouse.tar on the control node; returns its path."""

    # --- how to install -----------------------------------------------------------------------

    @abstractmethod
    def install_commands(self, staging: str, *, source: str, engine_wheel: str | None) -> list[list[str]]:
        """pip argument lists (without `pip`), in order, that build the env from `staging`."""

    # --- what to check ------------------------------------------------------------------------

    def pinned(self) -> dict[str, str]:
        """{distribution: version} of every pin (the manifest's and doctor's drift check)."""
        return lock_pins(self.requirements)

    def manifest_args(self) -> list[str]:
        """The ABI manifest script's arguments for an env of this lock, on its host."""
        return manifest_args(self.backend, self.pinned())

    @abstractmethod
    def image_build_manifest_args(self) -> list[str]:
        """The manifest's arguments while the engine image is built (no GPU there)."""

    # --- container images ---------------------------------------------------------------------

    @property
    def image_flavour(self) -> str:
        """docker/cuda/Dockerfile.j2's flavour: `cpu`, or the CUDA flavour (`cu130`)."""
        return CPU_FLAVOUR

    def image_base(self) -> str | None:
        """The engine image's base for this lock; None: the CPU flavour's OS image."""
        return None

    # --- how it is shown ----------------------------------------------------------------------

    @abstractmethod
    def plan_rows(self) -> dict[str, str]:
        """`provision --plan`'s rows for this lock (row name -> value)."""

    def describe(self) -> str:
        """doctor's one-line description of the lock."""
        return f"env {self.short_hash}"


@dataclass(frozen=True)
class Lock(EngineLock):
    """A reference-backend lock: CPU wheels from the wheelhouse, installed in one offline pip run."""

    backend: str
    python_tag: str  # "cp311": the host's interpreter
    platform: str  # the wheel platform tag the wheelhouse is built for
    requirements: tuple[str, ...]  # sorted "name==version" lines, the engine included
    engine_source: str  # sha256 of the engine's sources: a code change is a new environment

    warns_on_extra_packages = True

    @property
    def hash(self) -> str:
        """sha256 of the sorted pinned requirement lines, the python tag, the platform and the engine source."""
        lines = sorted(self.requirements) + [
            f"python={self.python_tag}",
            f"platform={self.platform}",
            f"engine-source={self.engine_source}",
        ]
        return hashlib.sha256("\n".join(lines).encode()).hexdigest()

    def requirements_text(self) -> str:
        return "".join(f"{line}\n" for line in sorted(self.requirements))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["requirements"] = list(self.requirements)
        d["hash"] = self.hash
        d["short_hash"] = self.short_hash
        return d

    def install_source(self, configured: str) -> str:
        return "wheelhouse"  # reference envs always come from the wheelhouse (CPU torch is not on PyPI's Linux index)

    def ensure_wheelhouse(self, engine_dir: Path, source: str) -> Path:
        return wheelhouse.ensure_reference_wheelhouse(self, engine_dir)

    def install_commands(self, staging: str, *, source: str, engine_wheel: str | None) -> list[list[str]]:
        return install.reference_install_commands(staging)

    def image_build_manifest_args(self) -> list[str]:
        return ["--require", "ddtree_engine"]

    def plan_rows(self) -> dict[str, str]:
        return {"backend": self.backend, "python": self.python_tag, "platform": self.platform, "env": self.short_hash}


def python_tag(facts: dict, host: Host) -> str:
    """`cp311` from the host's facts (`python_version`: "3.11.2")."""
    version = str(facts.get("python_version") or "")
    tag = python_tag_of(version)
    if tag is None:
        raise ConfigError(f"host {host.name}: could not read its Python version from the facts ({version!r})")
    return tag


def resolve_lock(project: Project, host: Host, facts: dict) -> Lock:
    """The lock for one host.

    Args:
        project: the validated project (engine backend and settings).
        host: the host the lock is for.
        facts: what provision read off the host: `python_version` ("3.11.2"), `architecture` ("x86_64").
    Returns:
        a Lock (its requirements resolved on the control node, cached by their inputs).
    Raises:
        ConfigError: the backend or the host's platform is not supported (says which and why).
    """
    if project.engine.backend != "reference":
        raise ConfigError(SGLANG_FROM_PROBE)
    arch = facts.get("architecture")
    if arch != "x86_64":
        raise ConfigError(
            f"host {host.name}: the reference backend's wheelhouse is built for x86_64 hosts; this one is {arch!r}"
        )
    tag = python_tag(facts, host)
    engine_dir = engine_source_dir()
    requirements = wheelhouse.resolve_requirements(tag, REFERENCE_PLATFORM, engine_dir)
    return Lock(
        backend="reference",
        python_tag=tag,
        platform=REFERENCE_PLATFORM,
        requirements=tuple(sorted(requirements)),
        engine_source=engine_source_digest(engine_dir),
    )
