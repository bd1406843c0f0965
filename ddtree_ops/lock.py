"""The lock: exactly what one host's engine environment contains, and its hash (the env's name).

`resolve_lock(project, host, facts)` is the seam between host facts and what gets installed for the
reference backend (a CPU lock). The sglang backend's CUDA-ABI resolution (driver, GPU architecture,
CUDA flavour, kernel wheels) is `ddtree_ops.resolve.resolve`, from the host's probe.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass

from .config import Host, Project
from .exceptions import ConfigError

# The hosts this resolver supports: glibc ≥ 2.28 on x86_64 (Debian 10+, Ubuntu 20.04+, RHEL 8+).
REFERENCE_PLATFORM = "manylinux_2_28_x86_64"
SHORT_HASH_LEN = 16
SGLANG_FROM_PROBE = (
    "resolve_lock makes reference locks from Ansible's facts; an sglang lock needs the host's probe "
    "(driver, GPUs): use ddtree_ops.resolve.resolve, as provision does"
)


@dataclass(frozen=True)
class Lock:
    backend: str
    python_tag: str  # "cp311": the host's interpreter
    platform: str  # the wheel platform tag the wheelhouse is built for
    requirements: tuple[str, ...]  # sorted "name==version" lines, the engine included
    engine_source: str  # sha256 of the engine's sources: a code change is a new environment

    @property
    def hash(self) -> str:
        """sha256 of the sorted pinned requirement lines, the python tag, the platform and the engine source."""
        lines = sorted(self.requirements) + [
            f"python={self.python_tag}",
            f"platform={self.platform}",
            f"engine-source={self.engine_source}",
        ]
        return hashlib.sha256("\n".join(lines).encode()).hexdigest()

    @property
    def short_hash(self) -> str:
        """The env's directory name: /opt/ddtree/envs/<short_hash>."""
        return self.hash[:SHORT_HASH_LEN]

    def requirements_text(self) -> str:
        return "".join(f"{line}\n" for line in sorted(self.requirements))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["requirements"] = list(self.requirements)
        d["hash"] = self.hash
        d["short_hash"] = self.short_hash
        return d


def python_tag(facts: dict, host: Host) -> str:
    """`cp311` from the host's facts (`python_version`: "3.11.2")."""
    version = str(facts.get("python_version") or "")
    parts = version.split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise ConfigError(f"host {host.name}: could not read its Python version from the facts ({version!r})")
    return f"cp{parts[0]}{parts[1]}"


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
    if project.engine.backend == "sglang":
        raise ConfigError(SGLANG_FROM_PROBE)
    arch = facts.get("architecture")
    if arch != "x86_64":
        raise ConfigError(
            f"host {host.name}: the reference backend's wheelhouse is built for x86_64 hosts; this one is {arch!r}"
        )
    tag = python_tag(facts, host)
    from . import wheelhouse  # the resolver runs pip: import only when a lock is actually resolved

    engine_dir = wheelhouse.engine_source_dir()
    requirements = wheelhouse.resolve_requirements(tag, REFERENCE_PLATFORM, engine_dir)
    return Lock(
        backend="reference",
        python_tag=tag,
        platform=REFERENCE_PLATFORM,
        requirements=tuple(sorted(requirements)),
        engine_source=wheelhouse.engine_source_digest(engine_dir),
    )
