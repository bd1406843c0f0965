"""`deploy`'s plan (pure): validate the command line against the project file (ConfigError, exit 2,
before any host is touched) and decide which services go to which hosts, with their unit values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..config import Host, Project, Service
from ..exceptions import ConfigError
from ..service import server_info
from ..service.client import base_url
from .gate import GateTarget
from .units import UnitSpec, api_key_line, env_file_values, unit_spec


@dataclass(frozen=True)
class ServicePlan:
    """One service on one host: where to probe it and what it must report."""

    host: str
    address: str
    service: str
    port: int
    algorithm: str
    budget: int | None
    topk: int | None
    spec: UnitSpec
    block_size: int | None = None  # what /server_info must report for dflash/ddtree
    backend: str = "reference"  # engine.backend (the server's dialect)

    @property
    def base_url(self) -> str:
        return base_url(self.address, self.port)

    def expected_server_info(self) -> dict[str, Any]:
        """What `/server_info` must report once this service is deployed."""
        return server_info.expected(self.algorithm, self.block_size, self.budget, self.topk, self.backend)

    def gate_target(self) -> GateTarget:
        """What the health gate needs of this service: where it answers and what it must report."""
        return GateTarget(self.host, self.service, self.base_url, self.expected_server_info(), self.backend)


@dataclass(frozen=True)
class HostPlan:
    host: str
    address: str
    services: list[ServicePlan]


@dataclass(frozen=True)
class DeployPlan:
    """What a deploy will do, before it touches anything."""

    project: Project  # with the command-line overrides applied
    hosts: list[HostPlan]
    warnings: list[str] = field(default_factory=list)
    api_key_line: str = field(default="", repr=False)  # the env files' key line (units.api_key_line)


def select_services(project: Project, names: list[str] | tuple[str, ...] | None) -> list[Service]:
    """The services named (all when none), in project order; unknown names raise ConfigError."""
    if not names:
        return list(project.services)
    for name in names:
        project.service(name)  # raises ConfigError naming the known services
    return [s for s in project.services if s.name in names]


def _width_warning(service: Service, block_size: int) -> str | None:
    width = service.budget + 1
    if width == block_size:
        return None
    return (
        f"service {service.name!r}: tree verify width budget+1 = {width} differs from block size {block_size}: "
        f"the linear baseline verifies {block_size} tokens per step and the tree {width}, so the tree costs a "
        f"different verify width than the linear baseline, so the comparison is not at equal cost "
        f"(use --budget {block_size - 1} for equal cost)"
    )


# From this budget on a first start on a hybrid target compiles SGLang's tree causal-conv1d update for minutes, where a
# service turns the engine's own off: it unrolls a loop over one request's verify rows (H100, 2026-12-05,
# benchmarks/results/sglang_h100_wide*_2026-12-05.json: 166 s at budget 128, not done after 400 s at 256).
WIDE_COMPILE_BUDGET = 128
# The engine's switch (on by default) that routes that conv to its own kernel, compiled once for every budget
# (engine_env.yaml); these words turn it off.
TREE_CONV_ENV = "DDTREE_SGLANG_TREE_CONV"
SWITCH_OFF = ("0", "false", "no", "off")


def _first_start_warning(service: Service, health_timeout_s: float) -> str | None:
    if service.budget < WIDE_COMPILE_BUDGET:
        return None
    if str(service.env.get(TREE_CONV_ENV, "")).strip().lower() not in SWITCH_OFF:
        return None  # the engine's tree conv runs: SGLang's is not compiled
    return (
        f"service {service.name!r}: {TREE_CONV_ENV}={service.env[TREE_CONV_ENV]!r} in its env, so at budget "
        f"{service.budget} ({service.budget + 1} verify rows a request) the first start on a hybrid (Gated-DeltaNet) "
        f"target compiles SGLang's tree causal-conv1d update for minutes (on an H100 166 s at budget 128, over 400 s at "
        f"256), inside deploy's wait of deploy.health_timeout_s = {health_timeout_s:g}s for /health: raise it for the "
        f"first deploy on a host if the gate times out; later starts reuse the compiled kernels "
        f"({env_file_values(service)['TRITON_CACHE_DIR']}). Without that setting the engine's kernel runs, compiled "
        f"once for every budget"
    )


def _shared_gpu_warnings(project: Project, hosts: list[Host], services: list[Service]) -> list[str]:
    # SGLang serves on the first GPU CUDA shows it: two unpinned services on one host both load onto
    # GPU 0 (and the second runs out of memory or halves the first's speed).
    warnings = []
    for host in hosts:
        unpinned = [s.name for s in services if not s.gpus and host in project.hosts_of(s)]
        if len(unpinned) > 1:
            warnings.append(
                f"host {host.name!r}: services {', '.join(map(repr, unpinned))} pin no GPU, so SGLang puts each on "
                f"the host's first GPU: give each its own with services[].gpus"
            )
    return warnings


def plan_deploy(
    project: Project,
    *,
    budget: int | None = None,
    topk: int | None = None,
    services: list[str] | tuple[str, ...] | None = None,
    hosts: list[str] | tuple[str, ...] | None = None,
    api_key: str | None = None,
) -> DeployPlan:
    """Decide which services go to which hosts, with `budget`/`topk` overriding the ddtree services.

    Args:
        project: the validated project file.
        budget, topk: overrides for every selected `ddtree` service (None = keep the file's).
        services, hosts: names to restrict the deploy to (None/empty = all).
        api_key: written to each service's env file as DDTREE_API_KEY (None = no key).

    Returns a DeployPlan with warnings. Raises ConfigError for unknown names, budget < 0,
    topk < 1, or overrides that apply to no selected service — before any host is touched.
    """
    if budget is not None and budget < 0:
        raise ConfigError(f"--budget {budget}: the tree budget must be >= 0 (0 verifies the root alone)")
    if topk is not None and topk < 1:
        raise ConfigError(f"--topk {topk}: topk must be >= 1")
    selected_hosts = project.select_hosts(list(hosts) if hosts else None)
    selected = select_services(project, services)

    overrides = {k: v for k, v in (("budget", budget), ("topk", topk)) if v is not None}
    if overrides and not any(s.algorithm == "ddtree" for s in selected):
        flags = " and ".join(f"--{k}" for k in overrides)
        raise ConfigError(
            f"{flags} override the ddtree service(s), but none is selected "
            f"(selected: {', '.join(s.name for s in selected)}): select a service with algorithm 'ddtree'"
        )
    overridden = {s.name: s.model_copy(update=overrides) if s.algorithm == "ddtree" else s for s in selected}
    project = project.model_copy(update={"services": [overridden.get(s.name, s) for s in project.services]})

    warnings: list[str] = []
    for service in overridden.values():
        if service.algorithm != "ddtree":
            continue
        warning = _width_warning(service, project.engine.block_size)
        if warning:
            warnings.append(warning)
        if service.topk > max(service.budget, 1):
            warnings.append(
                f"service {service.name!r}: topk {service.topk} > budget {service.budget}: "
                f"at most {max(service.budget, 1)} candidates per depth can be used"
            )
        if project.engine.backend == "sglang":
            warning = _first_start_warning(service, project.deploy.health_timeout_s)
            if warning:
                warnings.append(warning)

    if project.engine.backend == "sglang":
        warnings += _shared_gpu_warnings(project, selected_hosts, list(overridden.values()))

    host_plans: list[HostPlan] = []
    for host in selected_hosts:
        plans = [
            ServicePlan(
                host=host.name,
                address=host.address,
                service=service.name,
                port=service.port,
                algorithm=service.algorithm,
                budget=service.budget,
                topk=service.topk,
                block_size=project.engine.block_size,
                backend=project.engine.backend,
                spec=unit_spec(
                    service,
                    host,
                    project.engine,
                    metrics_log_interval=project.deploy.metrics_log_interval,
                    api_key=api_key,
                ),
            )
            for service in overridden.values()
            if host in project.hosts_of(service)
        ]
        if plans:
            host_plans.append(HostPlan(host=host.name, address=host.address, services=plans))
    if not host_plans:
        raise ConfigError(
            f"nothing to deploy: none of the selected services ({', '.join(overridden)}) runs on the selected "
            f"hosts ({', '.join(h.name for h in selected_hosts)}); check services[].hosts"
        )
    return DeployPlan(project=project, hosts=host_plans, warnings=warnings, api_key_line=api_key_line(api_key))


def server_info_mismatches(info: dict[str, Any], plan: ServicePlan) -> list[str]:
    """Differences between `/server_info` and what was deployed, as `key: server says X, deployed Y`."""
    return server_info.mismatches(plan.expected_server_info(), info)
