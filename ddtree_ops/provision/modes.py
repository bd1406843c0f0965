"""Install modes: where a lock's env lives on a host — a venv (`/opt/ddtree/envs/<hash>`) or the engine
image (`ddtree-engine:<hash>`, recorded under `/opt/ddtree/images/<hash>`). Everything that differs
between the two sits here, behind `InstallMode`; `install_mode(name)` picks one.
"""

from __future__ import annotations

import dataclasses
import platform
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from ..config import Host, Project
from ..exceptions import ConfigError
from ..hosts import layout
from ..hosts.ansible import run_playbook
from ..hosts.probe import HostFacts
from ..hosts.ssh import SSH, Transport
from ..lab.docker import engine_answers
from . import container
from .closure import machine_of
from .resolve import Refusal

DOCKER_ENGINE_PLAYBOOK = "container_engine.yml"


@dataclass
class Prepared:
    """What a mode did on the control node and hosts before the provision playbook runs."""

    image_tags: dict[str, str] = field(default_factory=dict)  # lock short hash -> image tag
    loaded: set[str] = field(default_factory=set)  # hosts the image was streamed to now
    changed: dict[str, int] = field(default_factory=dict)  # host -> Ansible's changed count


class InstallMode(ABC):
    """What `engine.install.mode` decides: where the env is built, recorded and checked."""

    name: str
    builds_image: bool  # units run the engine in a container; doctor checks Docker

    @property
    def state_key(self) -> str:
        """The key provision records the env (or image) under in state.json."""
        return layout.state_key(self.name)

    @abstractmethod
    def record_dir(self, short_hash: str) -> str:
        """The directory on the host that stands for a lock's env (and holds its stored manifest)."""

    @abstractmethod
    def env_python(self, host_python: str | None) -> str | None:
        """The Python a reference lock is made for: the host's, or the image's."""

    @abstractmethod
    def facts_for_lock(self, facts: HostFacts, plan_lock: Callable[[HostFacts], object], python_min: str) -> HostFacts:
        """The facts an sglang lock is resolved from (the image's Python and glibc in container mode)."""

    def check_supported(self) -> None:
        """Refuse what this machine cannot do for the mode, before any host is touched (ConfigError)."""

    def prepare(self, project: Project, hosts: list[Host], locks: dict, tarballs: dict, source: str, lap, log_dir, progress, transport: Transport = SSH, run_playbook=run_playbook) -> Prepared:
        """Work before the provision playbook (container mode: build and ship the images)."""
        return Prepared()


class VenvMode(InstallMode):
    name = "venv"
    builds_image = False

    def record_dir(self, short_hash: str) -> str:
        return layout.env_dir(short_hash)

    def env_python(self, host_python: str | None) -> str | None:
        return host_python

    def facts_for_lock(self, facts, plan_lock, python_min):
        return facts


class ContainerMode(InstallMode):
    name = "container"
    builds_image = True

    def record_dir(self, short_hash: str) -> str:
        return layout.image_record_dir(short_hash)

    def env_python(self, host_python: str | None) -> str | None:
        return container.base_python_version()  # the env lives in the image: its Python decides the wheels

    def facts_for_lock(self, facts, plan_lock, python_min):
        """The env lives in the image, so the image's Python (and glibc) decide the wheels, not the host's.
        The flavour, and so the base image, depends on the driver and GPUs only: it is chosen first with a
        Python the release supports."""
        first = plan_lock(dataclasses.replace(facts, python_version=python_min, glibc=None))
        python = None if isinstance(first, Refusal) else container.image_python_version(container.base_image(first))
        return dataclasses.replace(facts, python_version=python, glibc=None) if python else facts

    def check_supported(self) -> None:
        if container.docker_sdk() is None:
            raise ConfigError("engine.install.mode container builds the engine image here with the Docker SDK: pip install docker")
        if not engine_answers():
            raise ConfigError(
                "engine.install.mode container builds the engine image on this machine, but no Docker Engine answers here "
                "(`docker info` failed): start Docker, or set engine.install.mode: venv"
            )

    def prepare(self, project, hosts, locks, tarballs, source, lap, log_dir, progress, transport: Transport = SSH, run_playbook=run_playbook) -> Prepared:
        """Build each lock's image here, start Docker on the hosts, stream the image to those without it."""
        out = Prepared()
        for lock in locks.values():
            if lock.short_hash not in out.image_tags:
                same_machine_or_refuse(lock)
                out.image_tags[lock.short_hash], _ = container.ensure_engine_image(lock, tarballs[lock.short_hash], source, progress)
        lap("image")
        engine_vars = {"ddtree_provision_locks": {name: {"docker_gpus": gives_gpus(project, name, lock)} for name, lock in locks.items()}}
        result = run_playbook(DOCKER_ENGINE_PLAYBOOK, project, hosts, engine_vars, log_dir=log_dir)
        lap("docker_engine")
        out.loaded = {host.name for host in hosts if container.ship_image(host, out.image_tags[locks[host.name].short_hash], transport=transport)}
        lap("ship")
        out.changed = {name: outcome.changed for name, outcome in result.hosts.items()}
        return out


MODES: dict[str, InstallMode] = {mode.name: mode for mode in (VenvMode(), ContainerMode())}


def install_mode(name: str) -> InstallMode:
    """The InstallMode called `name` (`engine.install.mode`)."""
    return MODES[name]


def gives_gpus(project: Project, host_name: str, lock) -> bool:
    """Whether containers on the host get GPUs: it lists GPU UUIDs, or its probe found GPUs (sglang locks)."""
    return bool(project.host(host_name).gpus) or bool(lock.gpu_archs)


def same_machine_or_refuse(lock) -> None:
    """An image builds for this machine's architecture; a lock for another one cannot be built here."""
    here = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
    wanted = machine_of(lock.platform)
    if wanted != here:
        raise ConfigError(
            f"the lock is for {wanted} hosts but this machine is {here}: container mode builds the image here, "
            f"so build on a {wanted} control node or use engine.install.mode: venv"
        )
