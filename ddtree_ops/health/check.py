"""`healthcheck`: is every deployed service up, configured as deployed, and able to generate?

Per host and service, in parallel: the systemd unit (state and restart count, over SSH), the ABI
manifest stored beside the host's engine environment, `/health`, `/server_info` against what was
deployed, a short greedy generation, and the service's lifetime acceptance from `/metrics`
(ACCEPT_DEFINITION: committed tokens per verify step, prefill excluded; see
`metrics_text.accept_length_lifetime` for the counters it reads and its fallbacks) next to a
recent one (RECENT_ACCEPT_DEFINITION: the same counters' deltas between a scrape just before and
just after healthcheck's own greedy generation, so it says how the drafter does now, not since
start). Every problem is collected (not raised) so one report shows all of them.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import httpx

from ..progress import Progress, silent
from ..config import Host, Project, Service
from ..exceptions import ConfigError, HostError
from ..hosts.layout import STATE_PATH, env_of_state, state_key, unit_name
from ..hosts.query import HostState, UnitState, query_host
from ..hosts.ssh import SSH, Transport
from ..provision.manifest import EnvVerdict, verdict_from_text
from ..service import server_info
from ..service.client import ServiceClient, service_url
from ..service.metrics_text import (
    ACCEPT_DEFINITION,
    GENERATION_TOKENS,
    MetricsParseError,
    accept_length_delta,
    accept_length_lifetime,
)

# Every host's SSH check and every service's HTTP check get their own thread, up to this many: each
# check mostly waits (on the network, on the host's engine), so a fleet is checked in about the time
# of its slowest host rather than the sum of them.
MAX_WORKERS = 64
GENERATION_PROMPT = "The capital of France is"
GENERATION_MAX_TOKENS = 8
RECENT_ACCEPT_DEFINITION = (
    f"recent = over healthcheck's own {GENERATION_MAX_TOKENS}-token greedy probe (/metrics counter deltas "
    "around it; other traffic in that second counts too); lifetime = since the server started"
)


@dataclass
class ServiceHealth:
    """Everything healthcheck found about one service on one host."""

    host: str
    service: str
    url: str
    unit: UnitState | None = None  # None when the systemd check was skipped or SSH failed
    manifest: EnvVerdict | None = None  # the host env's stored ABI manifest (None: not read)
    health_status: int | None = None
    info: dict[str, Any] | None = None
    expected_info: dict[str, Any] = field(default_factory=dict)
    info_mismatches: list[str] = field(default_factory=list)
    generation_text: str | None = None
    generation_tokens: int | None = None
    accept_length: float | None = None  # lifetime committed tokens per verify step, prefill excluded
    accept_source: str | None = None  # metrics_text.SOURCE_*: which counters it came from
    accept_length_recent: float | None = None  # the same, over healthcheck's own probe (RECENT_ACCEPT_DEFINITION)
    failures: list[str] = field(default_factory=list)  # "check: what is wrong"
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["manifest"] = self.manifest.to_dict() if self.manifest else None
        d["ok"] = self.ok
        return d

    def failure_entries(self) -> list[dict[str, Any]]:
        """This service's failures as the envelope's `{host, service, message}` items."""
        return [{"host": self.host, "service": self.service, "message": f} for f in self.failures]


@dataclass
class HealthReport:
    results: list[ServiceHealth]
    systemd_checked: bool
    # {"wall": s, "workers": n, "checks": [{"host", "check", "start", "end"}]}: seconds since the run
    # began, one entry per SSH check (check "ssh") and per HTTP check (check = the service's name).
    timings_s: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def failures(self) -> list[str]:
        """One line per failed check: `host/service: check: problem`."""
        return [f"{r.host}/{r.service}: {f}" for r in self.results for f in r.failures]

    def manifests(self) -> dict[str, EnvVerdict]:
        """host -> its env's manifest verdict (hosts whose manifest was read)."""
        return {r.host: r.manifest for r in self.results if r.manifest is not None}

    def to_dict(self) -> dict[str, Any]:
        """The `--json` document (schemas/healthcheck.json): the common envelope, services nested by host."""
        hosts: dict[str, dict[str, Any]] = {}
        manifests = self.manifests()
        for r in self.results:
            entry = hosts.setdefault(r.host, {"host": r.host, "ok": True, "services": []})
            entry["manifest"] = manifests[r.host].to_dict() if r.host in manifests else None
            entry["ok"] = entry["ok"] and r.ok
            entry["services"].append(r.to_dict())
        return {
            "ok": self.ok,
            "systemd_checked": self.systemd_checked,
            "accept_definition": ACCEPT_DEFINITION,
            "accept_recent_definition": RECENT_ACCEPT_DEFINITION,
            "warnings": [f"{r.host}/{r.service}: {w}" for r in self.results for w in r.warnings],
            "failures": [f for r in self.results for f in r.failure_entries()],
            "hosts": list(hosts.values()),
            "timings_s": self.timings_s,
        }


# ---- what was deployed -------------------------------------------------------------------------


def _native(value: Any) -> Any:
    # Values templated by Ansible can arrive as strings ("15", "None"): read them back as JSON would.
    if isinstance(value, str):
        if value in ("", "None", "null"):
            return None
        if value.lstrip("-").isdigit():
            return int(value)
    return value


def deployed_settings(
    state: dict[str, Any] | None, service: str, releases: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """What deploy recorded for `service` on the host ({} when nothing was recorded).

    Deploy keeps `{"services": {name: {"current": release_id, …}}}` in state.json and the
    algorithm/budget/topk in that release's release.json (`releases`); a state.json entry that
    carries budget/topk itself (`{"release": …, "budget": …, "topk": …}`) is read directly.
    """
    if releases and isinstance(releases.get(service), dict):
        entry: Any = releases[service]
    else:
        entry = ((state or {}).get("services") or {}).get(service) if isinstance(state, dict) else None
        if isinstance(entry, dict) and isinstance(entry.get("current"), dict):
            entry = entry["current"]
    if not isinstance(entry, dict):
        return {}
    return {k: _native(entry.get(k)) for k in ("algorithm", "budget", "topk", "block_size") if k in entry}


def expected_server_info(project: Project, service: Service, deployed: dict[str, Any]) -> dict[str, Any]:
    """The `/server_info` values the service must report.

    Algorithm, budget and topk come from state.json when deploy set them (`deploy --budget`), else
    from the project file.
    """
    budget, topk = deployed.get("budget"), deployed.get("topk")
    return server_info.expected(
        deployed.get("algorithm") or service.algorithm,
        deployed.get("block_size") or project.engine.block_size,
        service.budget if budget is None else budget,
        service.topk if topk is None else topk,
        project.engine.backend,
    )


def unit_failures(unit: UnitState) -> tuple[list[str], list[str]]:
    """(failures, warnings) for a unit's systemd state."""
    failures, warnings = [], []
    if unit.load_state == "not-found":
        failures.append(f"unit: {unit.unit} is not installed on the host: run `ddtree-ops deploy`")
    elif not unit.running:
        failures.append(
            f"unit: {unit.unit} is {unit.describe()}, expected active/running "
            f"(see `journalctl -u {unit.unit}` on the host)"
        )
    if unit.restarts:
        warnings.append(f"unit: {unit.unit} was restarted {unit.restarts} time(s) by systemd")
    return failures, warnings


# ---- the HTTP checks ---------------------------------------------------------------------------


@dataclass
class HttpFacts:
    """What the service's HTTP API answered (raw facts; judged in `evaluate`)."""

    health_status: int | None = None
    info: dict[str, Any] | None = None
    generation: dict[str, Any] | None = None
    accept_length: float | None = None
    generation_tokens_total: float | None = None
    failures: list[str] = field(default_factory=list)
    accept_source: str | None = None
    accept_length_recent: float | None = None  # over the probe generation (RECENT_ACCEPT_DEFINITION)


def probe_http(url: str, timeout_s: float = 30.0, backend: str = "reference") -> HttpFacts:
    """Ask the service /health, /server_info, /metrics, a greedy completion and /metrics again, in that order.

    The two scrapes around the completion give its recent acceptance; the second the lifetime one.
    On the sglang backend `/health_generate` is asked after `/health` (SGLang's `/health` does not generate).

    Stops after /health when it is not 200: the rest would only repeat that failure.

    Args:
        url: the service's base URL.
        timeout_s: per request.
        backend: the project's engine.backend (the server's dialect, service/dialect.py).
    Returns:
        the raw facts; `evaluate` judges them.
    """
    facts = HttpFacts()
    with ServiceClient(url, timeout_s=timeout_s, backend=backend) as client:
        try:
            facts.health_status = client.health_status()
        except httpx.HTTPError as err:
            facts.failures.append(f"health: cannot reach {url}/health: {str(err) or type(err).__name__}")
            return facts
        if facts.health_status != 200:
            facts.failures.append(
                f"health: {url}/health answered {facts.health_status} (503 = still loading or not warmed up)"
            )
            return facts
        try:
            generating = client.generation_health_status()
        except httpx.HTTPError as err:
            generating = None
            facts.failures.append(f"health: {url}/health_generate failed: {str(err) or type(err).__name__}")
        if generating not in (None, 200):
            facts.failures.append(
                f"health: {url}/health_generate answered {generating}: /health is 200 but the scheduler did not "
                "generate a token (see the service's journal)"
            )
        try:
            facts.info = client.server_info()
        except (httpx.HTTPError, ValueError) as err:
            facts.failures.append(f"server_info: {url}/server_info failed: {err}")
        try:
            before = client.metrics()  # the recent acceptance's start; a failure shows in the scrape below
        except (httpx.HTTPError, ValueError, MetricsParseError):
            before = None
        try:
            facts.generation = client.complete(GENERATION_PROMPT, GENERATION_MAX_TOKENS, model=client.model_id())
        except (httpx.HTTPError, ValueError) as err:
            facts.failures.append(f"generation: a {GENERATION_MAX_TOKENS}-token greedy completion failed: {err}")
        try:
            metrics = client.metrics()
            facts.generation_tokens_total = metrics.total(GENERATION_TOKENS)
            acceptance = accept_length_lifetime(metrics)
            facts.accept_length, facts.accept_source = acceptance.value, acceptance.source
            if before is not None:
                facts.accept_length_recent = accept_length_delta(before, metrics).value
            if facts.generation_tokens_total is None:
                facts.failures.append(f"metrics: {url}/metrics has no {GENERATION_TOKENS}")
        except (httpx.HTTPError, ValueError, MetricsParseError) as err:
            facts.failures.append(f"metrics: {url}/metrics failed: {err}")
    return facts


def _generation_failures(generation: dict[str, Any] | None) -> tuple[str | None, int | None, list[str]]:
    if generation is None:
        return None, None, []
    choices = generation.get("choices") or []
    text = choices[0].get("text") if choices else None
    tokens = (generation.get("usage") or {}).get("completion_tokens")
    if text is None or not tokens:
        return text, tokens, [f"generation: the completion returned no tokens (usage.completion_tokens={tokens!r})"]
    return text, tokens, []


def manifest_findings(verdict: EnvVerdict) -> tuple[list[str], list[str]]:
    """(failures, warnings) for the host env's stored ABI manifest.

    A failed manifest is a failure (the next restart may not come up); a missing one a warning,
    since envs provisioned before manifests existed still run.
    """
    if verdict.status == "failed":
        return [f"manifest: {verdict.env} failed its ABI manifest: " + "; ".join(verdict.manifest.failure_lines())], []
    if verdict.status in ("missing", "invalid"):
        return [], [f"manifest: {verdict.problem}: run `ddtree-ops provision {verdict.host}` to verify the environment"]
    return [], []


def evaluate(
    host: Host,
    service: Service,
    project: Project,
    http: HttpFacts,
    host_facts: HostState | None,
    host_error: str | None,
    manifest: EnvVerdict | None = None,
) -> ServiceHealth:
    """Judge one service from what was gathered (pure: no I/O)."""
    result = ServiceHealth(host=host.name, service=service.name, url=service_url(host, service))
    if host_error:
        result.failures.append(f"ssh: {host_error}")
    if manifest is not None:
        result.manifest = manifest
        fails, warns = manifest_findings(manifest)
        result.failures += fails
        result.warnings += warns
    deployed: dict[str, Any] = {}
    if host_facts is not None:
        result.unit = host_facts.units.get(service.name)
        if result.unit is not None:
            fails, warns = unit_failures(result.unit)
            result.failures += fails
            result.warnings += warns
        if host_facts.state_error:
            result.warnings.append(f"state: {host_facts.state_error}; comparing against the project file")
        elif host_facts.state is None:
            result.warnings.append(f"state: no {STATE_PATH} on the host (not deployed?); comparing against the project file")
        deployed = deployed_settings(host_facts.state, service.name, host_facts.releases)
    result.health_status = http.health_status
    result.info = http.info
    result.failures += http.failures
    result.expected_info = expected_server_info(project, service, deployed)
    if http.info is not None:
        result.info_mismatches = server_info.mismatches(result.expected_info, http.info)
        result.failures += [f"server_info: {m}" for m in result.info_mismatches]
    text, tokens, gen_failures = _generation_failures(http.generation)
    result.generation_text, result.generation_tokens = text, tokens
    result.failures += gen_failures
    result.accept_length, result.accept_source = http.accept_length, http.accept_source
    result.accept_length_recent = http.accept_length_recent
    return result


def select_services(project: Project, names: list[str] | tuple[str, ...] | None) -> list[Service]:
    """The services named on the command line (all when none); unknown names are ConfigError."""
    if not names:
        return list(project.services)
    for name in names:
        project.service(name)
    return [s for s in project.services if s.name in names]


def run_healthcheck(
    project: Project,
    host_names: list[str] | tuple[str, ...] | None = None,
    service_names: list[str] | tuple[str, ...] | None = None,
    *,
    check_systemd: bool = True,
    timeout_s: float = 30.0,
    max_workers: int | None = None,
    progress: Progress = silent,
    transport: Transport = SSH,
) -> HealthReport:
    """Check every selected service on every selected host that runs it, in parallel.

    Args:
        project: the validated project file.
        host_names, service_names: filters (None = all); unknown names raise ConfigError.
        check_systemd: also query systemd and state.json over SSH (off for servers run by hand).
        timeout_s: per HTTP request and per SSH command.
        max_workers: threads for the SSH and HTTP checks (None: one per check, up to MAX_WORKERS).
        progress: called with one-line status messages.
        transport: the SSH seam.

    Returns:
        one ServiceHealth per (host, service), in project order; `report.ok` is the verdict;
        `report.timings_s` says when each check ran.
    """
    hosts = project.select_hosts(host_names)
    services = select_services(project, service_names)
    pairs = [(h, s) for h in hosts for s in services if h.name in {x.name for x in project.hosts_of(s)}]
    if not pairs:
        raise ConfigError("no service runs on the selected hosts: check --hosts/--services against the project file")
    say = progress
    ssh_hosts = list({h.name: h for h, _ in pairs}.values()) if check_systemd else []
    workers = max_workers or max(1, min(MAX_WORKERS, len(ssh_hosts) + len(pairs)))
    started = time.monotonic()
    checks: list[dict[str, Any]] = []

    def timed(host: Host, check: str, task: Callable[[], Any]) -> Any:
        start = time.monotonic() - started
        try:
            return task()
        finally:
            # list.append is atomic: the threads need no lock for it.
            checks.append({"host": host.name, "check": check, "start": round(start, 3), "end": round(time.monotonic() - started, 3)})

    def host_task(host: Host) -> tuple[HostState, EnvVerdict]:
        return timed(host, "ssh", lambda: _host_facts(host))

    def _host_facts(host: Host) -> tuple[HostState, EnvVerdict]:
        names = [s.name for h, s in pairs if h.name == host.name]
        say(f"{host.name}: querying {', '.join(unit_name(n) for n in names)} over SSH")
        mode = project.engine.install.mode
        # One SSH round trip per host: units, state.json, the current releases and the stored manifest.
        facts, manifest_text = query_host(host, names, env_key=state_key(mode), timeout_s=timeout_s, transport=transport)
        env = env_of_state(facts.state, mode)
        if env is None:
            return facts, EnvVerdict(host.name, None, "missing", problem=f"no {state_key(mode)} recorded in {STATE_PATH}")
        return facts, verdict_from_text(host.name, env, manifest_text or "")

    def http_task(host: Host, service: Service) -> HttpFacts:
        say(f"{host.name}/{service.name}: checking {service_url(host, service)}")
        url = service_url(host, service)
        return timed(host, service.name, lambda: probe_http(url, timeout_s=timeout_s, backend=project.engine.backend))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        host_futures = {h.name: pool.submit(host_task, h) for h in ssh_hosts}
        http_futures = [pool.submit(http_task, h, s) for h, s in pairs]
        facts: dict[str, tuple[HostState | None, EnvVerdict | None, str | None]] = {}
        for name, fut in host_futures.items():
            try:
                facts[name] = (*fut.result(), None)
            except HostError as err:
                facts[name] = (None, None, str(err))
        results = []
        for (host, service), fut in zip(pairs, http_futures):
            host_facts, verdict, host_error = facts.get(host.name, (None, None, None))
            results.append(evaluate(host, service, project, fut.result(), host_facts, host_error, verdict))
    timings = {"wall": round(time.monotonic() - started, 3), "workers": workers, "checks": sorted(checks, key=lambda c: c["start"])}
    return HealthReport(results=results, systemd_checked=check_systemd, timings_s=timings)
