"""`compare`: the same prompts against a baseline service and a tree service on each host.

Measured the way that survives scrutiny: a warm-up per service first; arms alternate run by run
(so drift hits both); temperature 0 and identical request bodies on both arms; token counts
only from the server's `usage` (stream chunks are not tokens); acceptance from `/metrics`
counter deltas around each run (the lifetime gauge would mix in earlier traffic), as committed
tokens per verify step with the prefill's token excluded (ACCEPT_DEFINITION; counting it would
favour the arm with fewer steps); and at temperature 0 both arms must produce identical output
(the lossless check).
"""

from __future__ import annotations

import datetime as _dt
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import httpx

from ..progress import Progress, silent
from ..config import Host, Project, Service
from ..exceptions import CheckFailed, ConfigError
from ..service.client import ServiceClient, service_url
from ..service.metrics_text import ACCEPT_DEFINITION
from .measure import ARMS, DEFAULT_STALL_S, RunResult, compare_host, failure, failure_line
from .prompts import Prompt
from .report import PromptSummary, Totals, summarize_prompt, totals, write_report_files

PREFLIGHT_TIMEOUT_S = 10.0
PREFLIGHT_WORKERS = 32
NOISY_RUNS_WARNING = (
    "--runs 1: one run per prompt per arm is noise (decode speed varies from run to run): "
    "use --runs 3 or more before acting on the speedup"
)


@dataclass
class CompareSettings:
    baseline: str
    tree: str
    runs: int
    max_tokens: int
    hosts: list[str]
    prompts: list[dict[str, Any]]
    baseline_config: dict[str, Any] = field(default_factory=dict)
    tree_config: dict[str, Any] = field(default_factory=dict)
    # What the tree arm ran with, as its /server_info reported it (the project file's when it did not
    # say): `deploy --budget` may have overridden the file, and the numbers are only worth as much as
    # knowing the settings behind them.
    budget: int | None = None
    topk: int | None = None
    block_size: int | None = None


@dataclass
class CompareReport:
    started_at: str
    settings: CompareSettings
    runs: list[RunResult]
    summaries: list[PromptSummary]
    totals: Totals
    failures: list[dict[str, Any]]  # service errors and lossless failures, `failure(host, service, what)`
    warnings: list[str] = field(default_factory=list)
    server_info: dict[str, dict[str, Any]] = field(default_factory=dict)  # "host/service" -> /server_info

    @property
    def ok(self) -> bool:
        return not self.failures

    def failure_lines(self) -> list[str]:
        return [failure_line(f) for f in self.failures]

    def to_dict(self) -> dict[str, Any]:
        """compare.json and the `--json` document (schemas/compare.json): the common envelope, a
        `hosts` summary (geomean speedup, the tree arm's settings per host), prompts and runs flat
        (each names its host)."""
        hosts = []
        for host in self.settings.hosts:
            info = self.server_info.get(f"{host}/{self.settings.tree}") or {}
            hosts.append({
                "host": host,
                "speedup": self.totals.host_speedup.get(host),
                "budget": info.get("speculative_ddtree_budget"),
                "topk": info.get("speculative_ddtree_topk"),
                "block_size": info.get("speculative_num_draft_tokens"),
            })  # fmt: skip
        return {
            "ok": self.ok,
            "started_at": self.started_at,
            "accept_definition": ACCEPT_DEFINITION,
            "settings": asdict(self.settings),
            "hosts": hosts,
            "totals": asdict(self.totals),
            "prompts": [asdict(s) for s in self.summaries],
            "runs": [asdict(r) for r in self.runs],
            "failures": self.failures,
            "warnings": self.warnings,
            "server_info": self.server_info,
        }


def _service_config(service: Service) -> dict[str, Any]:
    return {"name": service.name, "algorithm": service.algorithm, "port": service.port, "budget": service.budget, "topk": service.topk}


def plan_hosts(project: Project, baseline: Service, tree: Service, host_names: Sequence[str] | None) -> list[Host]:
    """The hosts to compare on: those selected that run both services.

    Raises:
        ConfigError: an explicitly named host lacks one of the services, or no host runs both.
    """
    selected = project.select_hosts(list(host_names) if host_names else None)
    both = {h.name for h in project.hosts_of(baseline)} & {h.name for h in project.hosts_of(tree)}
    if host_names:
        missing = [h.name for h in selected if h.name not in both]
        if missing:
            raise ConfigError(
                f"--hosts: {', '.join(missing)} do(es) not run both {baseline.name!r} and {tree.name!r}; "
                "check services[].hosts in the project file"
            )
    hosts = [h for h in selected if h.name in both]
    if not hosts:
        raise ConfigError(f"no host runs both {baseline.name!r} and {tree.name!r}: check services[].hosts")
    return hosts


def validate_compare_args(project: Project, baseline: str, tree: str, runs: int, max_tokens: int) -> tuple[Service, Service]:
    """Check the arguments before any host is touched (ConfigError = exit 2)."""
    if baseline == tree:
        raise ConfigError(f"--baseline and --tree are both {baseline!r}: compare two different services")
    if runs < 1:
        raise ConfigError(f"--runs must be >= 1, got {runs}")
    if max_tokens < 2:
        # Decode speed needs at least one token after the first (which comes from the prefill).
        raise ConfigError(f"--max-tokens must be >= 2 to measure decode speed, got {max_tokens}")
    return project.service(baseline), project.service(tree)


def run_compare(
    project: Project,
    prompts: Sequence[Prompt],
    *,
    baseline: str = "baseline",
    tree: str = "tree",
    runs: int = 3,
    max_tokens: int = 128,
    host_names: Sequence[str] | None = None,
    timeout_s: float = 600.0,
    stall_s: float | None = DEFAULT_STALL_S,
    progress: Progress = silent,
    parallel_hosts: int = 1,
) -> CompareReport:
    """Measure baseline vs tree on every selected host that runs both.

    By default hosts are measured one after another, so that hosts sharing one machine (the lab's
    containers) do not slow each other's runs down. Hosts that are machines of their own can be
    measured at once (`parallel_hosts`): on each host the arms still take turns, so the speedup is
    measured as before, and a fleet takes about the time of its slowest host.

    Args:
        project: the validated project file.
        prompts: what to send (see prompts.load_prompts).
        baseline, tree: service names from the project file.
        runs: measured runs per prompt per arm.
        max_tokens: completion length limit (the same on both arms).
        host_names: restrict to these hosts (None = all that run both services).
        timeout_s: per request.
        stall_s: the longest a request may go without a byte from the server; a host that stays
            silent that long is given up (its remaining runs are not attempted), and the other hosts
            are measured. None = `timeout_s`.
        parallel_hosts: how many hosts are measured at once (1: one after another).

    Returns:
        the report; `report.ok` is False when a service errored or a lossless check failed.

    Raises:
        ConfigError: bad arguments, before any host is contacted.
        CheckFailed: no selected host has both services answering /health 200 (each named), before
            anything is measured. A host where only some do is not measured: its services are in
            the report's failures, and the other hosts are measured.
    """
    baseline_svc, tree_svc = validate_compare_args(project, baseline, tree, runs, max_tokens)
    if not prompts:
        raise ConfigError("no prompts to send")
    hosts = plan_hosts(project, baseline_svc, tree_svc, host_names)
    # Every arm of a host must be up before that host is measured. When no host is, there is nothing
    # to measure and the caller writes no report; when some are, those are measured and the others
    # are failures of the report (exit 1), so one host down does not cost the fleet's measurement.
    problems = preflight(hosts, [baseline_svc, tree_svc], timeout_s, project.engine.backend)
    down = {p["host"] for p in problems}
    if problems and all(h.name in down for h in hosts):
        raise CheckFailed(
            "compare: not every service is healthy, so nothing was measured and no report was written:\n  "
            + "\n  ".join(failure_line(p) for p in problems)
            + "\nrun `ddtree-ops healthcheck` for details, or `ddtree-ops deploy` to bring them up"
        )
    say = progress
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    arms = {"baseline": baseline_svc, "tree": tree_svc}
    all_runs: list[RunResult] = []
    failures: list[dict[str, Any]] = [
        {**p, "message": f"not measured: {p['message']}; run `ddtree-ops healthcheck --hosts {p['host']}`"} for p in problems
    ]
    warnings: list[str] = [NOISY_RUNS_WARNING] if runs == 1 else []
    server_info: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    if down:
        say(f"not measuring {', '.join(sorted(down))}: a service there is not healthy (see the failures)")
    measured = [h for h in hosts if h.name not in down]

    def measure(host: Host) -> tuple[list[RunResult], list[dict[str, Any]], list[str]]:
        # Each host fills its own lists; they are joined in host order, so the report reads the same
        # however many hosts ran at once.
        runs_of, failures_of, warnings_of = [], [], []
        compare_host(
            host, arms, prompts, runs, max_tokens, timeout_s, say, runs_of, failures_of, warnings_of, server_info,
            project.engine.backend, stall_s,
        )  # fmt: skip
        return runs_of, failures_of, warnings_of

    with ThreadPoolExecutor(max_workers=max(1, min(parallel_hosts, len(measured) or 1))) as pool:
        for runs_of, failures_of, warnings_of in pool.map(measure, measured):
            all_runs += runs_of
            failures += failures_of
            warnings += warnings_of
    say(f"measured {len(all_runs)} runs in {time.perf_counter() - t0:.1f}s")

    summaries = []
    for host in hosts:
        for prompt in prompts:
            mine = [r for r in all_runs if r.host == host.name and r.prompt == prompt.name]
            if not mine:
                continue  # the host failed before this prompt; its failure is already listed
            summary = summarize_prompt(
                host.name,
                prompt.name,
                [r for r in mine if r.arm == "baseline"],
                [r for r in mine if r.arm == "tree"],
            )
            # An arm without one successful run (its service killed, say) was compared with nothing: its
            # failed runs are the failures, and "lossless check failed" would accuse the tree wrongly.
            compared = {r.arm for r in mine if r.error is None} >= set(ARMS)
            if not summary.lossless.ok and compared:
                failures.append(failure(host.name, None, f"prompt {prompt.name!r}: lossless check failed: {summary.lossless.detail}"))
            summaries.append(summary)
    settings = CompareSettings(
        baseline=baseline,
        tree=tree,
        runs=runs,
        max_tokens=max_tokens,
        hosts=[h.name for h in hosts],
        prompts=[p.to_dict() for p in prompts],
        baseline_config=_service_config(baseline_svc),
        tree_config=_service_config(tree_svc),
        **_tree_settings(project, tree_svc, [server_info.get(f"{h.name}/{tree}") or {} for h in hosts]),
    )
    return CompareReport(
        started_at=started,
        settings=settings,
        runs=all_runs,
        summaries=summaries,
        totals=totals(summaries),
        failures=failures,
        warnings=warnings,
        server_info=server_info,
    )


def _tree_settings(project: Project, tree: Service, infos: list[dict[str, Any]]) -> dict[str, Any]:
    # The first host whose tree answered /server_info speaks for the run (hosts[] has each one's).
    info = next((i for i in infos if i), {})
    return {
        "budget": info.get("speculative_ddtree_budget", tree.budget),
        "topk": info.get("speculative_ddtree_topk", tree.topk),
        "block_size": info.get("speculative_num_draft_tokens") or project.engine.block_size,
    }


def preflight(
    hosts: Sequence[Host], services: Sequence[Service], timeout_s: float, backend: str = "reference"
) -> list[dict[str, Any]]:
    """Is every service to be measured answering `/health` 200? Asked before anything is measured or written.

    Args:
        hosts, services: what compare would measure (each service on each host).
        timeout_s: per request (capped at PREFLIGHT_TIMEOUT_S: a healthy server answers at once).
        backend: the project's engine.backend (the servers' dialect).

    Returns:
        one failure per service that is not healthy, naming why (empty: go ahead).
    """

    def ask(host: Host, svc: Service) -> dict[str, Any] | None:
        url = service_url(host, svc)
        with ServiceClient(url, timeout_s=min(timeout_s, PREFLIGHT_TIMEOUT_S), backend=backend) as client:
            try:
                status = client.health_status()
            except httpx.HTTPError as err:
                return failure(host.name, svc.name, f"cannot reach {url}/health: {str(err) or type(err).__name__}")
        if status != 200:
            return failure(host.name, svc.name, f"{url}/health answered {status} (503: still loading)")
        return None

    # All at once (a /health answer is cheap): one unreachable host costs its timeout once, not once per host.
    pairs = [(host, svc) for host in hosts for svc in services]
    with ThreadPoolExecutor(max_workers=max(1, min(PREFLIGHT_WORKERS, len(pairs)))) as pool:
        answers = list(pool.map(lambda pair: ask(*pair), pairs))
    return [a for a in answers if a is not None]


def write_compare_files(report: CompareReport, out_dir: str | Path) -> dict[str, Path]:
    """compare.json, compare.md and compare.png in `out_dir`; returns their paths."""
    return write_report_files(report.to_dict(), report.summaries, report.totals, Path(out_dir))


def default_out_dir(now: _dt.datetime | None = None) -> str:
    """./ddtree-compare-<local timestamp>."""
    now = now or _dt.datetime.now()
    return f"ddtree-compare-{now.strftime('%Y%m%d-%H%M%S')}"
