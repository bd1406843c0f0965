"""The project file (`ddtree.yaml`): schema, loading and complete up-front validation.

Every command reads one project file and validates all of it before any host is touched.
Errors name the key (`services[1].port`) and say how to fix it.
"""

from __future__ import annotations

import difflib
import os
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from . import knowledge
from .knowledge.service_env import ENV_NAME_PATTERN, env_problems, switches_as_words
from .exceptions import ConfigError, yaml_error_message
from .state import known_hosts_file

DEFAULT_CONFIG_NAME = "ddtree.yaml"
CONFIG_ENV = "DDTREE_CONFIG"
DEFAULT_KNOWN_HOSTS_NAME = "known_hosts"  # beside the project file unless `ssh.known_hosts` says otherwise

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
    # Set by `parse_project` from the project-level `ssh.known_hosts` (not keys of the file): where this
    # host's SSH key is recorded, and the project file to name in `ddtree-ops hosts trust` advice.
    _known_hosts: Path | None = PrivateAttr(None)
    _project_file: Path | None = PrivateAttr(None)

    @property
    def known_hosts(self) -> Path:
        """The known_hosts file SSH checks this host's key against (the state dir's for a host made outside a project)."""
        return self._known_hosts if self._known_hosts is not None else known_hosts_file()

    @property
    def project_file(self) -> Path | None:
        """The project file this host was read from, if any."""
        return self._project_file

    def bound_to(self, known_hosts: str | os.PathLike, project_file: str | os.PathLike | None = None) -> Host:
        """A copy of this host whose SSH checks its key against `known_hosts` (set by the loader; the lab uses it too)."""
        copy = self.model_copy()
        copy._known_hosts = Path(known_hosts)
        copy._project_file = Path(project_file) if project_file is not None else None
        return copy


class ProjectSsh(_Strict):
    # Where the hosts' SSH host keys are recorded (`ddtree-ops hosts trust`); relative paths are
    # relative to the project file's folder. None: `known_hosts` beside the project file.
    known_hosts: str | None = None


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
        if self.hybrid_mode == "spine" and self.backend == "sglang":
            raise ValueError(
                "hybrid_mode 'spine' is implemented in the reference backend only; SGLang's DDTREE worker refuses it "
                "on a hybrid target at startup: use hybrid_mode 'safe' (exact) with backend 'sglang'"
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
    # Extra environment of the service's process (written to its env file): the engine's switches
    # (knowledge/engine_env.yaml) or anything else the server reads (NCCL_*, TRITON_CACHE_DIR, ...).
    env: dict[str, str] = {}
    hosts: list[str] | None = None  # None = every host

    @field_validator("env", mode="before")
    @classmethod
    def _switches_as_words(cls, env: Any) -> Any:
        # YAML reads an engine switch's bare `off` as false and `0` as 0: they stand for its words. Any other
        # value that is not text is refused (format_validation_error says to quote it), so values stay verbatim.
        return switches_as_words(env) if isinstance(env, dict) else env

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
    ssh: ProjectSsh = ProjectSsh()
    # Where the services' API key comes from (never the key itself): the name of an environment variable
    # of the caller, or a file (0600, relative to this file's folder). Neither: $DDTREE_API_KEY, if set.
    api_key_env: str | None = Field(None, pattern=ENV_NAME_PATTERN)
    api_key_file: str | None = Field(None, min_length=1)

    @field_validator("api_key_file")
    @classmethod
    def _key_file_is_a_path(cls, path: str | None) -> str | None:
        if path is not None and "\n" in path:
            raise ValueError("a path, not the key itself: put the key in a file (chmod 600) and name that file here")
        return path

    @model_validator(mode="after")
    def _one_key_source(self) -> Project:
        if self.api_key_env is not None and self.api_key_file is not None:
            raise ValueError("api_key_env and api_key_file both name the API key: keep one")
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _every_problem_at_once(cls, data: Any, handler) -> Project:
        """Field errors and the checks across sections (ports, GPUs, host names), in one report.

        An `after` validator would only run once every field is valid, so a port clash would show up
        only after the other errors were fixed, and with no path. These checks read the raw document
        leniently instead (a malformed entry is skipped: its field errors already name it).
        """
        try:
            project, field_errors = handler(data), []
        except ValidationError as err:
            project, field_errors = None, err.errors()
        document = project.model_dump() if project is not None else data
        cross = cross_section_problems(document) + env_problems(document) if isinstance(document, dict) else []
        if not field_errors and not cross:
            return project
        line_errors = [_reraised(e) for e in field_errors]
        line_errors += [
            InitErrorDetails(type=PydanticCustomError("cross_section", "{message}", {"message": msg}), loc=loc, input=None)
            for loc, msg in cross
        ]
        raise ValidationError.from_exception_data(cls.__name__, line_errors)

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


def _reraised(error: dict) -> InitErrorDetails:
    """A pydantic error dict back into a line error (value errors keep their message, not the exception)."""
    if error["type"] in ("value_error", "assertion_error"):
        message = error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        return InitErrorDetails(type=PydanticCustomError(error["type"], "{message}", {"message": message}), loc=error["loc"], input=error.get("input"))
    return InitErrorDetails(type=error["type"], loc=error["loc"], input=error.get("input"), ctx=error.get("ctx") or {})


def _entries(document: dict, section: str) -> list[tuple[int, dict]]:
    value = document.get(section)
    return [(i, e) for i, e in enumerate(value) if isinstance(e, dict)] if isinstance(value, list) else []


def cross_section_problems(document: dict) -> list[tuple[tuple, str]]:
    """What no single section can check: duplicate host and service names, unknown hosts in `services[].hosts`,
    two services on one port of one host, and GPU indexes a host does not list.

    Args:
        document: the project document, raw (malformed entries are skipped) or a validated model's dump.
    Returns:
        (location, message) pairs, in document order; empty when all is well.
    """
    problems: list[tuple[tuple, str]] = []
    hosts: dict[str, tuple[int, object]] = {}
    for i, host in _entries(document, "hosts"):
        if isinstance(host.get("name"), str):
            if host["name"] in hosts:
                problems.append((("hosts", i, "name"), f"{host['name']!r} appears twice; names must be unique"))
            hosts.setdefault(host["name"], (i, host.get("gpus", [])))
    seen_names: set[str] = set()
    seen_ports: dict[tuple[str, int], str] = {}
    for i, service in _entries(document, "services"):
        name = service.get("name")
        if isinstance(name, str):
            if name in seen_names:
                problems.append((("services", i, "name"), f"{name!r} appears twice; names must be unique"))
            seen_names.add(name)
        on = service.get("hosts")
        if isinstance(on, list):
            unknown = [h for h in on if isinstance(h, str) and h not in hosts]
            if unknown:
                problems.append((("services", i, "hosts"), f"unknown host(s) {', '.join(map(repr, unknown))}; known hosts: {sorted(hosts)}"))
            on = [h for h in on if h in hosts]
        elif on is None:
            on = list(hosts)
        else:
            continue  # a malformed `hosts` has its own field error
        port = service.get("port")
        for host in on:
            if isinstance(port, int) and not isinstance(port, bool):
                other = seen_ports.setdefault((host, port), str(name))
                if other != str(name):
                    problems.append((("services", i, "port"), f"port {port} is used twice on host {host!r} (services "
                                     f"{other!r} and {name!r}); give each service its own port"))  # fmt: skip
            problems += _gpu_problems(i, service.get("gpus"), host, *hosts[host])
    return problems


def _gpu_problems(i: int, pinned: object, host: str, host_index: int, host_gpus: object) -> list[tuple[tuple, str]]:
    if not isinstance(pinned, list) or not pinned or not isinstance(host_gpus, list):
        return []
    where = ("services", i, "gpus")
    if not host_gpus:
        return [(where, f"pins GPU(s) {pinned}, but host {host!r} lists no GPU: add its GPU UUIDs in index order to "
                 f"hosts[{host_index}].gpus (`nvidia-smi -L` on the host), or remove services[{i}].gpus")]  # fmt: skip
    missing = [g for g in pinned if isinstance(g, int) and not 0 <= g < len(host_gpus)]
    if missing:
        return [(where, f"GPU index(es) {missing} do(es) not exist on host {host!r}, which lists {len(host_gpus)} GPU(s) "
                 f"(indexes 0..{len(host_gpus) - 1} of hosts[{host_index}].gpus)")]  # fmt: skip
    return []


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


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The model class whose keys live at `loc` (list indexes skipped), starting from Project."""
    model: type[BaseModel] = Project
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        inner = [a for a in _flatten(field.annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not inner:
            return None
        model = inner[0]
    return model


def _flatten(annotation: object) -> list[object]:
    args = typing.get_args(annotation)
    return [annotation] if not args else [a for arg in args for a in _flatten(arg)]


def unknown_key_message(loc: tuple) -> str:
    """`unknown key 'health_timout_s': did you mean 'health_timeout_s'?`, or the keys allowed there.

    Args:
        loc: the pydantic location of the unknown key (its last part is the key).
    Returns:
        the message, with the closest allowed key when one is close enough.
    """
    key = str(loc[-1])
    model = _model_at(loc[:-1])
    allowed = list(model.model_fields) if model is not None else []
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    if close:
        return f"unknown key {key!r}: did you mean {close[0]!r}?"
    listed = f"; the keys here are: {', '.join(allowed)}" if allowed else ""
    return f"unknown key {key!r}: remove it or check its spelling{listed}"


def _env_type_message(loc: tuple, value: object) -> tuple[tuple, str]:
    """A `services[N].env` name or value that YAML did not read as text: where, and to quote it."""
    if loc[-1] == "[key]":
        return loc[:3], f"the name {value!r} is not text: names are letters, digits and _ (write it in quotes if YAML reads it otherwise)"
    kind = "nothing (null)" if value is None else f"{'an' if type(value).__name__[0] in 'aeiou' else 'a'} {type(value).__name__}"
    example = '""' if value is None else '"…"'
    return loc, f"YAML read this value as {kind}; the environment takes text: write it in quotes ({loc[3]}: {example})"


def format_validation_error(err: ValidationError, source: str) -> str:
    """Every problem of one project file, one line each: `  - services[1].port: <message and fix>`.

    Args:
        err: pydantic's error for the whole document.
        source: the file's path (or a description), named in the first line.
    Returns:
        the text of the ConfigError.
    """
    lines = [f"{source}: {err.error_count()} problem(s) in the project file:"]
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not str(p).startswith("function-"))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = unknown_key_message(loc)
        elif e["type"] == "missing":
            msg = "required key is missing: add it"
        elif e["type"] == "string_type" and len(loc) >= 4 and loc[0] == "services" and loc[2] == "env":
            loc, msg = _env_type_message(loc, e.get("input"))
        lines.append(f"  - {_format_location(loc) or '(top level)'}: {msg}")
    return "\n".join(lines)


def parse_project(data: object, source: str = "ddtree.yaml", path: str | os.PathLike | None = None) -> Project:
    """Validate an already-parsed document; raises ConfigError naming every bad key.

    Args:
        data: the parsed YAML document.
        source: how error messages name the document.
        path: the project file it came from: `ssh.known_hosts` is relative to its folder, and
            `hosts trust` advice names it. None: a document with no file (relative to the current folder).
    Returns:
        the project; each host is bound to the project's known_hosts file (`Host.known_hosts`).
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the project file must be a YAML mapping (hosts:, engine:, services:)")
    try:
        project = Project.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None
    known_hosts = known_hosts_path(project, path)
    hosts = [h.bound_to(known_hosts, path) for h in project.hosts]
    return project.model_copy(update={"hosts": hosts})


def known_hosts_path(project: Project, path: str | os.PathLike | None) -> Path:
    """The project's known_hosts file: `ssh.known_hosts` (relative to the project file's folder), else
    `known_hosts` beside the project file (the current folder for a document with no file)."""
    folder = Path(path).parent if path is not None else Path(".")
    configured = Path(project.ssh.known_hosts).expanduser() if project.ssh.known_hosts else Path(DEFAULT_KNOWN_HOSTS_NAME)
    return (folder / configured).absolute()


def load_project(path: str | os.PathLike | None = None) -> Project:
    """Read and validate the project file (see `resolve_config_path`)."""
    p = resolve_config_path(path)
    if not p.exists():
        raise ConfigError(
            f"no project file at {p}: pass -c PATH, set ${CONFIG_ENV}, run `ddtree-ops init` to write one, "
            "or `ddtree-ops lab up` for a local lab"
        )
    text = p.read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(yaml_error_message(err, p, text)) from None
    return parse_project(data, str(p), p)
