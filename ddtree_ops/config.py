"""The project file (`ddtree.yaml`): schema, loading and complete up-front validation.

Every command reads one project file and validates all of it before any host is touched.
Errors name the key (`services[1].port`) and say how to fix it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from . import knowledge
from .exceptions import ConfigError

DEFAULT_CONFIG_NAME = "ddtree.yaml"
CONFIG_ENV = "DDTREE_CONFIG"

Algorithm = Literal["ar", "dflash", "ddtree"]
HybridMode = Literal["safe", "spine", "unsafe"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SshSettings(_Strict):
    user: str = "root"
    port: int = Field(22, ge=1, le=65535)
    key: str | None = None  # path to the private key; None = the SSH agent / default keys


class Host(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    address: str
    ssh: SshSettings = SshSettings()
    # GPU UUIDs in index order (from the probe); services pin by UUID through these indexes.
    gpus: list[str] = []


class InstallSettings(_Strict):
    mode: Literal["venv", "container"] = "venv"
    python: str = "python3"
    # Where an sglang env's wheels come from: `wheelhouse` = downloaded on the control node for the
    # host's platform and copied over (air-gapped hosts); `index` = the host installs from the lock's
    # package indexes itself. Reference envs always come from the wheelhouse.
    source: Literal["wheelhouse", "index"] = "wheelhouse"
    # sglang: also install FlashInfer's precompiled JIT cache (from flashinfer.ai's index). Off where that
    # index is not reachable or mirrored; FlashInfer then compiles missing kernels at first use (needs nvcc).
    flashinfer_jit_cache: bool = True


class Engine(_Strict):
    backend: Literal["reference", "sglang"] = "reference"
    # A directory on the host, or the name `lab` for the model pair the engine ships.
    target: str
    draft: str
    block_size: int = Field(16, ge=2)
    hybrid_mode: HybridMode = "safe"
    allow_hybrid_unsafe: bool = False
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    install: InstallSettings = InstallSettings()
    # backend sglang: the SGLang release to lock (None = ddtree_ops/knowledge/sglang_releases.yaml's default).
    sglang_version: str | None = None

    @field_validator("sglang_version")
    @classmethod
    def _known_sglang_release(cls, version: str | None) -> str | None:
        known = knowledge.releases()["releases"]
        if version is not None and version not in known:
            raise ValueError(f"sglang {version} is not a release ddtree-ops has data for; use one of: {', '.join(sorted(known))}")
        return version

    @model_validator(mode="after")
    def _unsafe_needs_allow(self) -> Engine:
        if self.hybrid_mode == "unsafe" and not self.allow_hybrid_unsafe:
            raise ValueError(
                "hybrid_mode 'unsafe' corrupts output on hybrid models (sibling state leakage); "
                "it is for diagnosis only: set engine.allow_hybrid_unsafe: true to use it anyway"
            )
        return self


SERVICE_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]*$"  # also the unit's name: ddtree-<name>.service


class Service(_Strict):
    name: str = Field(pattern=SERVICE_NAME_PATTERN)
    algorithm: Algorithm
    port: int = Field(ge=1024, le=65535)
    budget: int | None = Field(None, ge=0)
    topk: int | None = Field(None, ge=1)
    spine_depth: int = Field(0, ge=0)
    gpus: list[int] = []  # indexes into the host's `gpus`
    extra_args: list[str] = []
    hosts: list[str] | None = None  # None = every host

    @model_validator(mode="after")
    def _tree_settings(self) -> Service:
        if self.algorithm == "ddtree":
            if self.budget is None or self.topk is None:
                raise ValueError("an algorithm 'ddtree' service needs both budget and topk")
        elif self.budget is not None or self.topk is not None:
            raise ValueError(f"budget/topk only apply to algorithm 'ddtree', not {self.algorithm!r}: remove them")
        return self


class DeploySettings(_Strict):
    health_timeout_s: float = Field(900.0, gt=0)  # model loads take minutes on real hosts
    health_interval_s: float = Field(2.0, gt=0)
    metrics_log_interval: int = Field(32, ge=1)  # verify steps between DDTREE metrics journal lines


class Project(_Strict):
    version: Literal[1] = 1
    hosts: list[Host] = Field(min_length=1)
    engine: Engine
    services: list[Service] = Field(min_length=1)
    deploy: DeploySettings = DeploySettings()

    @field_validator("hosts")
    @classmethod
    def _unique_hosts(cls, hosts: list[Host]) -> list[Host]:
        _ensure_unique([h.name for h in hosts], "hosts", "name")
        return hosts

    @model_validator(mode="after")
    def _cross_checks(self) -> Project:
        _ensure_unique([s.name for s in self.services], "services", "name")
        host_names = {h.name for h in self.hosts}
        seen_ports: dict[tuple[str, int], str] = {}
        for i, service in enumerate(self.services):
            for host in self.hosts_of(service):
                key = (host.name, service.port)
                if key in seen_ports:
                    raise ValueError(
                        f"services[{i}].port: port {service.port} is used twice on host {host.name!r} "
                        f"(services {seen_ports[key]!r} and {service.name!r}); give each service its own port"
                    )
                seen_ports[key] = service.name
                for gpu in service.gpus:
                    if host.gpus and gpu >= len(host.gpus):
                        raise ValueError(
                            f"services[{i}].gpus: GPU index {gpu} does not exist on host {host.name!r}, "
                            f"which lists {len(host.gpus)} GPU(s)"
                        )
            for name in service.hosts or []:
                if name not in host_names:
                    raise ValueError(
                        f"services[{i}].hosts: unknown host {name!r}; known hosts: {sorted(host_names)}"
                    )
        return self

    def hosts_of(self, service: Service) -> list[Host]:
        """The hosts a service runs on."""
        if service.hosts is None:
            return list(self.hosts)
        return [h for h in self.hosts if h.name in service.hosts]

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise ConfigError(f"unknown host {name!r}; the project file lists: {', '.join(h.name for h in self.hosts)}")

    def service(self, name: str) -> Service:
        for s in self.services:
            if s.name == name:
                return s
        raise ConfigError(
            f"unknown service {name!r}; the project file lists: {', '.join(s.name for s in self.services)}"
        )

    def select_hosts(self, names: list[str] | tuple[str, ...] | None) -> list[Host]:
        """The hosts named on the command line (all when none), in project order; unknown names are errors."""
        if not names:
            return list(self.hosts)
        for name in names:
            self.host(name)
        return [h for h in self.hosts if h.name in names]


def _ensure_unique(names: list[str], section: str, key: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise ValueError(f"{section}[{i}].{key}: {name!r} appears twice; names must be unique")
        seen.add(name)


def resolve_config_path(explicit: str | os.PathLike | None) -> Path:
    """`-c/--config`, else `$DDTREE_CONFIG`, else `./ddtree.yaml`."""
    if explicit:
        return Path(explicit)
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    return Path(DEFAULT_CONFIG_NAME)


def _format_location(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"{source}: {err.error_count()} problem(s) in the project file:"]
    for e in err.errors():
        loc = _format_location(tuple(p for p in e["loc"] if not str(p).startswith("function-after")))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = f"unknown key {loc.rsplit('.', 1)[-1]!r}: remove it or check its spelling"
        elif e["type"] == "missing":
            msg = "required key is missing: add it"
        lines.append(f"  - {loc or '(top level)'}: {msg}")
    return "\n".join(lines)


def parse_project(data: object, source: str = "ddtree.yaml") -> Project:
    """Validate an already-parsed document; raises ConfigError naming every bad key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the project file must be a YAML mapping (hosts:, engine:, services:)")
    try:
        return Project.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def load_project(path: str | os.PathLike | None = None) -> Project:
    """Read and validate the project file (see `resolve_config_path`)."""
    p = resolve_config_path(path)
    if not p.exists():
        raise ConfigError(
            f"no project file at {p}: pass -c PATH, set ${CONFIG_ENV}, run `ddtree-ops init` to write one, "
            "or `ddtree-ops lab up` for a local lab"
        )
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{p}: not valid YAML: {err}") from None
    return parse_project(data, str(p))
