"""What a service's systemd unit and env file say, as plain data (pure functions, no I/O).

The Ansible role `ddtree_deploy` renders these values through its templates
(`ansible/roles/ddtree_deploy/templates/`); `render_unit`/`render_env_file` render the same
templates locally so tests can check the text without a host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import jinja2
import yaml

from ..config import Engine, Host, Service
from ..exceptions import ConfigError
from ..hosts.layout import (
    ENV_FILE_DIR,
    IMAGE_ENV_DIR,
    cache_dir,
    cache_directory,
    container_name,
    env_file_path,
    syslog_identifier,
    unit_name,
)
from ..provision.kinds import lock_kind
from ..provision.modes import install_mode
from ..state import repo_root
from .sglang_command import API_KEY_ENV, sglang_args

ROLE_DIR = repo_root() / "ansible" / "roles" / "ddtree_deploy"
TEMPLATES_DIR = ROLE_DIR / "templates"
ENV_DIR = ENV_FILE_DIR
SERVE_HOST = "0.0.0.0"
# The program the unit runs from the env's bin/, per engine backend: the reference backend's own server,
# or the env's Python running SGLang's server (sglang_command.py).
EXECUTABLES = {"reference": "ddtree-engine", "sglang": "python"}

# Characters systemd's command-line parser treats as plain text without quoting.
_PLAIN_ARG = re.compile(r"^[A-Za-z0-9_./:=,@+-]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def serve_args(service: Service, engine: Engine, *, metrics_log_interval: int, host: str = SERVE_HOST) -> list[str]:
    """The `ddtree-engine serve …` arguments (without the executable) for a service.

    `budget`/`topk`/`spine_depth` are only passed to `ddtree` services: the other algorithms
    have no tree, so the flags would only make the unit claim settings that do nothing.
    """
    args = [
        "serve",
        "--target", engine.target,
        "--draft", engine.draft,
        "--algorithm", service.algorithm,
    ]  # fmt: skip
    if service.algorithm == "ddtree":
        args += ["--budget", str(service.budget), "--topk", str(service.topk)]
        if service.spine_depth:
            args += ["--spine-depth", str(service.spine_depth)]
    args += ["--hybrid-mode", engine.hybrid_mode]
    if engine.hybrid_mode == "unsafe" and engine.allow_hybrid_unsafe:
        args.append("--allow-hybrid-unsafe")
    if engine.device != "auto":
        args += ["--device", engine.device]
    if engine.dtype != "auto":
        args += ["--dtype", engine.dtype]
    args += [
        "--host", host,
        "--port", str(service.port),
        "--metrics-log-interval", str(metrics_log_interval),
    ]  # fmt: skip
    return args + list(service.extra_args)


def gpu_uuids(service: Service, host: Host) -> list[str]:
    """The UUIDs of the GPUs a service is pinned to on a host (empty: not pinned).

    Raises ConfigError when the service names GPU indexes the host does not list: pinning by
    index would silently pick whatever CUDA enumerates first.
    """
    if not service.gpus:
        return []
    if not host.gpus:
        raise ConfigError(
            f"service {service.name!r} pins GPU indexes {service.gpus}, but host {host.name!r} lists no GPU "
            f"UUIDs: add them to hosts[].gpus (from `nvidia-smi -L` or the provision probe)"
        )
    missing = [i for i in service.gpus if i >= len(host.gpus)]
    if missing:
        raise ConfigError(
            f"service {service.name!r} pins GPU index(es) {missing}, but host {host.name!r} lists only "
            f"{len(host.gpus)} GPU(s): fix services[].gpus or hosts[].gpus"
        )
    return [host.gpus[i] for i in service.gpus]


def container_run_args(service: Service, host: Host, engine: Engine, env_names: list[str]) -> list[str]:
    """The `docker run` flags between the container's name and the image, for container mode.

    Host networking keeps the port and /health where deploy and healthcheck look; the service's
    environment passes through by name from the unit (`-e NAME`, the values stay in the 0600 env
    file, out of the command line); GPUs by UUID like the venv units (all of them when the service
    pins none and the host lists GPUs or runs the sglang backend); model directories are mounted
    read-only at the same paths, the service's cache directory read-write. The image's entrypoint is
    `ddtree-engine`; an sglang service runs the image's env Python instead, with the same arguments as
    its venv unit.
    """
    args = ["--network", "host", "--init"]
    if engine.backend != "reference":
        args += ["--entrypoint", f"{IMAGE_ENV_DIR}/bin/{EXECUTABLES[engine.backend]}"]
    for name in env_names:
        args += ["-e", name]
    # The service's cache directory (the unit's CacheDirectory=) at the same path, so what one run compiles the
    # next reuses (`--rm` drops everything else the container wrote).
    cache = cache_dir(service.name)
    args += ["-v", f"{cache}:{cache}"]
    uuids = gpu_uuids(service, host)
    if uuids:
        # The quotes are part of the value: docker reads --gpus as CSV and a device list has commas.
        args += ["--gpus", '"device=' + ",".join(uuids) + '"']
    elif host.gpus or lock_kind(engine.backend).needs_gpu:
        args += ["--gpus", "all"]  # a GPU-only backend (sglang) gets them, listed or not
    for path in dict.fromkeys(p for p in (engine.target, engine.draft) if p.startswith("/")):
        args += ["-v", f"{path}:{path}:ro"]
    return args


def unit_environment(uuids: list[str]) -> dict[str, str]:
    """`Environment=` entries of the unit: GPU pinning by UUID, in PCI order so indexes match nvidia-smi."""
    if not uuids:
        return {}
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(uuids)}


def default_env(service: str) -> dict[str, str]:
    """Variables ddtree-ops sets unless the service's `env:` names them.

    `TRITON_CACHE_DIR`: Triton's compiled kernels in the service's cache directory (`hosts.layout.cache_dir`,
    the unit's CacheDirectory=), which outlives restarts, releases and, mounted, the container. A start
    compiles every Triton kernel it meets for the first time, and SGLang's tree verify compiles some per
    verify width: on an H100 (2026-12-05) its causal-conv1d update took 166 s to compile at DDTREE 128/8
    (129 rows a request, a loop unrolled over them) and did not finish within 400 s at 256/8; with the cache
    only the first start pays that.
    """
    return {"TRITON_CACHE_DIR": f"{cache_dir(service)}/triton"}


def env_file_values(service: Service) -> dict[str, str]:
    """The contents of `/etc/ddtree/<service>.env` but the API key (`api_key_line`), which is carried apart:
    ddtree-ops' own variables, then `default_env` under the service's `env` (knowledge.service_env.TOOL_SET_ENV
    keeps that off ddtree-ops' own)."""
    return {
        "PYTHONUNBUFFERED": "1",
        # Hosts may have no network; models come from local paths or the engine package.
        "HF_HUB_OFFLINE": "1",
        "DDTREE_SERVICE": service.name,
        # Sorted: the env file is part of the release, so reordering `env:` alone is no new release.
        **dict(sorted({**default_env(service.name), **service.env}.items())),
    }


def api_key_line(api_key: str | None) -> str:
    """The env-file line `DDTREE_API_KEY="…"` (empty without a key).

    It reaches the role as its own variable (`ddtree_deploy_api_key_line`), never inside a service's
    variables: Ansible prints a loop's item (the whole service) when a task of that loop fails, and
    that output is kept in the log and quoted in the error.
    """
    return f"{API_KEY_ENV}={env_file_quote(api_key)}" if api_key else ""


def systemd_quote(arg: str) -> str:
    """One argument as systemd's ExecStart parser reads it back verbatim.

    `%` starts a specifier and `$` a variable expansion in ExecStart, so both are doubled.
    """
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if _PLAIN_ARG.match(escaped):
        return escaped
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def env_file_quote(value: str) -> str:
    """A value for an `EnvironmentFile=` line (double-quoted, backslash escapes)."""
    if "\n" in value:
        raise ConfigError("environment values cannot contain newlines")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class UnitSpec:
    """Everything the templates need for one service on one host (JSON-able via `as_vars`)."""

    service: str
    algorithm: str
    port: int
    budget: int | None
    topk: int | None
    serve_args: list[str]
    unit_environment: dict[str, str] = field(default_factory=dict)
    env_file: dict[str, str] = field(default_factory=dict)
    runtime: str = "venv"  # venv | container (engine.install.mode)
    container_args: list[str] = field(default_factory=list)
    executable: str = EXECUTABLES["reference"]  # in the env's bin/ (venv mode)
    api_key_line: str = field(default="", repr=False)  # the env file's key line; not in `as_vars`

    @property
    def unit(self) -> str:
        return unit_name(self.service)

    def as_vars(self) -> dict:
        """The role's per-service variables (`ddtree_deploy_services[]`)."""
        for name in [*self.unit_environment, *self.env_file]:
            if not _ENV_NAME.match(name):
                raise ConfigError(f"service {self.service!r}: {name!r} is not a valid environment variable name")
        return {
            "name": self.service,
            "unit": self.unit,
            "syslog_identifier": syslog_identifier(self.service),
            "cache_directory": cache_directory(self.service),
            "env_file": env_file_path(self.service),
            "algorithm": self.algorithm,
            "port": self.port,
            "budget": self.budget,
            "topk": self.topk,
            "serve_args": list(self.serve_args),
            "serve_args_quoted": [systemd_quote(a) for a in self.serve_args],
            "executable": self.executable,
            "unit_environment": [f"{systemd_quote(f'{k}={v}')}" for k, v in self.unit_environment.items()],
            "env_file_lines": [f"{k}={env_file_quote(v)}" for k, v in self.env_file.items()],
            "runtime": self.runtime,
            "container_name": container_name(self.service),
            "container_args_quoted": [systemd_quote(a) for a in self.container_args],
        }


def unit_spec(
    service: Service, host: Host, engine: Engine, *, metrics_log_interval: int, api_key: str | None = None
) -> UnitSpec:
    """The unit and env-file values of `service` on `host`.

    Args:
        service, host, engine: from the project file.
        metrics_log_interval: verify steps between `DDTREE metrics:` lines (reference backend).
        api_key: written to the env file only (None = no key).
    Returns:
        the UnitSpec. Raises ConfigError for GPU pins the host cannot satisfy and settings the backend cannot run.
    """
    env_file = env_file_values(service)
    env_names = [*env_file, *([API_KEY_ENV] if api_key else [])]
    container = install_mode(engine.install.mode).builds_image
    if engine.backend == "sglang":
        args = sglang_args(service, engine, host=SERVE_HOST)
    else:
        args = serve_args(service, engine, metrics_log_interval=metrics_log_interval)
    return UnitSpec(
        service=service.name,
        algorithm=service.algorithm,
        port=service.port,
        budget=service.budget,
        topk=service.topk,
        serve_args=args,
        # In a container the GPUs are chosen by `--gpus`; CUDA inside sees only those.
        unit_environment={} if container else unit_environment(gpu_uuids(service, host)),
        env_file=env_file,
        runtime=engine.install.mode,
        container_args=container_run_args(service, host, engine, env_names) if container else [],
        executable=EXECUTABLES[engine.backend],
        api_key_line=api_key_line(api_key),
    )


def _jinja_env():
    # Ansible's template module defaults: trim_blocks on, keep the trailing newline.
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        trim_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )


def role_defaults() -> dict:
    return yaml.safe_load((ROLE_DIR / "defaults" / "main.yml").read_text())


def render_unit(spec: UnitSpec, env_path: str, image: str = "", **overrides) -> str:
    """The unit text the role writes, rendered locally (for tests and `--plan` style previews).

    `env_path` is the venv (venv mode), `image` the engine image's tag (container mode).
    """
    variables = {
        **role_defaults(),
        "ddtree_deploy_engine_env": env_path,
        "ddtree_deploy_engine_image": image,
        "ddtree_deploy_service": spec.as_vars(),
        **overrides,
    }
    return _jinja_env().get_template("ddtree.service.j2").render(**variables)


def render_env_file(spec: UnitSpec, **overrides) -> str:
    variables = {
        **role_defaults(),
        "ddtree_deploy_service": spec.as_vars(),
        "ddtree_deploy_api_key_line": spec.api_key_line,
        **overrides,
    }
    return _jinja_env().get_template("service.env.j2").render(**variables)
