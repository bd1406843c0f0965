"""Lock kinds: which lock each `engine.backend` gets and how it is planned from a host's facts.

The one place a backend name is looked at: `lock_kind(backend)` returns the kind, and the kind makes
the lock (or the refusal). What a lock then does (download, install, check) is the lock's own
business (`EngineLock`, lock.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from ..config import Host, Project
from ..hosts.probe import HostFacts
from .engine_source import engine_source_digest, engine_source_dir
from .lock import EngineLock, resolve_lock
from .modes import install_mode
from .resolve import Refusal, release_data, requested_attention_backend, resolve


class LockKind(ABC):
    """How the locks of one backend are made."""

    backend: str
    facts_from_probe: bool  # provision reads the host's probe (else Ansible's facts)
    needs_gpu: bool  # the engine of this backend only runs on GPUs

    @abstractmethod
    def plan(
        self, project: Project, host: Host, facts: HostFacts, target_archs: tuple[str, ...] = ()
    ) -> tuple[HostFacts, EngineLock | Refusal]:
        """The lock `host` gets from `facts`, or why it gets none. Touches nothing.

        Returns:
            (the facts the lock was resolved from — the image's Python in container mode —, the lock or refusal).
        Raises:
            ConfigError: bad arguments (unknown release or architecture).
        """

    def install_source(self, project: Project) -> str:
        """Where the env's wheels come from for this backend."""
        return project.engine.install.source


class ReferenceKind(LockKind):
    backend = "reference"
    facts_from_probe = False
    needs_gpu = False

    def plan(self, project, host, facts, target_archs=()):
        python = install_mode(project.engine.install.mode).env_python(facts.python_version)
        return facts, resolve_lock(project, host, {"python_version": python, "architecture": facts.machine})

    def install_source(self, project: Project) -> str:
        return "wheelhouse"  # reference envs always come from the wheelhouse


class SglangKind(LockKind):
    backend = "sglang"
    facts_from_probe = True
    needs_gpu = True

    def plan(self, project, host, facts, target_archs=()):
        def lock_for(facts_used: HostFacts):
            return resolve(
                facts_used,
                host.name,
                release=engine_release(project),
                engine_source=engine_source_digest(engine_source_dir()),
                target_archs=target_archs,
                attention_backend=attention_backend_for(project, host),
                flashinfer_jit_cache=project.engine.install.flashinfer_jit_cache,
            )

        _, rel = release_data(engine_release(project))
        facts = install_mode(project.engine.install.mode).facts_for_lock(facts, lock_for, rel["python"]["min"])
        return facts, lock_for(facts)


KINDS: dict[str, LockKind] = {kind.backend: kind for kind in (ReferenceKind(), SglangKind())}


def lock_kind(backend: str) -> LockKind:
    """The LockKind of `engine.backend`."""
    return KINDS[backend]


def engine_release(project: Project) -> str | None:
    """The SGLang release the project asks for (engine.sglang_version when the schema has it)."""
    return getattr(project.engine, "sglang_version", None)


def attention_backend_for(project: Project, host: Host) -> str | None:
    wanted = {requested_attention_backend(s.extra_args) for s in project.services if host in project.hosts_of(s)}
    wanted.discard(None)
    return sorted(wanted)[0] if wanted else None
