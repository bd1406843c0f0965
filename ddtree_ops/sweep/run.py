"""`sweep`'s run: one host at a time, one configuration at a time, never two on one service at once.

For each host, for each configuration: drain the tree service (no request in flight, from its own
gauges), redeploy it with that budget/topk through the normal health-gated deploy (a failed gate
rolls it back), check it is healthy and idle again (its warm-up done), then measure it against the
untouched baseline with compare's machinery (compare's own warm-up request, alternating arms,
usage-based token counts, metric deltas, the lossless check at T = 0). A host is put back on what
it ran before the sweep before the next host starts, so only one host is ever off its original
configuration (with --apply, every host gets the chosen configuration at the end instead).

A failed cell (drain timeout, deploy gate, a request that failed, the service killed) is recorded
with the journal tail and the sweep goes on with the next configuration on that host, once the
service is healthy again (systemd restarts it, or the last good configuration is redeployed).
A host whose service cannot be brought back drops out: its remaining cells are skipped, the
other hosts go on. Ctrl-C stops the sweep: the host being swept is put back on its original
configuration first, and `--resume DIR` continues later.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Sequence

import httpx

from ..compare.prompts import Prompt
from ..compare.report import median
from ..compare.run import CompareReport, preflight, run_compare
from ..config import Host
from ..deploy.gate import GateTarget, systemd_unit_probe, wait_healthy
from ..deploy.plan import plan_deploy
from ..deploy.rollout import execute_deploy, stored_manifest_gate
from ..exceptions import CheckFailed, DdtreeOpsError
from ..hosts.ansible import run_playbook as real_run_playbook
from ..hosts.layout import STATE_CURRENT, STATE_PATH, service_entries, unit_name
from ..hosts.ssh import SSH, Transport
from ..progress import Progress, silent
from ..service.client import ServiceClient, service_url
from .drain import check_gauges, wait_drained
from .plan import APPLY_BEST, SweepConfig, SweepPlan
from .state import CELL_FAILED, CELL_OK, CELL_SKIPPED, SweepState, now_iso

DRAIN_TIMEOUT_S = 300.0
JOURNAL_LINES = 20


@dataclass(frozen=True)
class SweepSeams:
    """The side effects a sweep hands on: the Ansible runner (deploy) and the SSH transport."""

    run_playbook: Callable[..., Any] = real_run_playbook
    transport: Transport = SSH
    # Held around everything that may change hosts (after the read-only preflight): the CLI passes the
    # hosts' own locks (hosts/lock.py); the default holds none.
    lock: Callable[[list[Host]], AbstractContextManager] = lambda _hosts: nullcontext()


@dataclass
class SweepOutcome:
    """What the run did; report.py turns it (with the state's cells) into the documents."""

    interrupted: bool = False
    failures: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    resumed_skipped: list[str] = field(default_factory=list)  # cells measured by an earlier run, not again
    applied: dict[str, Any] | None = None  # {"budget", "topk", "why"} with --apply


def settings_of(plan: SweepPlan, prompts: Sequence[Prompt]) -> dict[str, Any]:
    """What sweep-state.json keeps so that `--resume` measures exactly the same thing."""
    return {
        "budgets": list(dict.fromkeys(c.budget for c in plan.configs)),
        "topks": list(dict.fromkeys(c.topk for c in plan.configs)),
        "tree": plan.tree.name,
        "baseline": plan.baseline.name,
        "hosts": [h.name for h in plan.hosts],
        "runs": plan.runs,
        "max_tokens": plan.max_tokens,
        "block_size": plan.block_size,
        "prompts": [p.to_dict() for p in prompts],
    }


def _failure(host: str | None, service: str | None, message: str) -> dict[str, Any]:
    return {"host": host, "service": service, "message": message}


class SweepRun:
    """One invocation of a sweep (a fresh one, or the rest of an interrupted one)."""

    def __init__(
        self,
        plan: SweepPlan,
        prompts: Sequence[Prompt],
        state: SweepState,
        *,
        progress: Progress = silent,
        seams: SweepSeams | None = None,
        drain_timeout_s: float = DRAIN_TIMEOUT_S,
        timeout_s: float = 600.0,
    ) -> None:
        self.plan, self.prompts, self.state = plan, list(prompts), state
        self.say = progress
        self.seams = seams or SweepSeams()
        self.drain_timeout_s, self.timeout_s = drain_timeout_s, timeout_s
        self.outcome = SweepOutcome(warnings=list(plan.warnings))
        self.dropped: set[str] = set()
        self.off_original: dict[str, Host] = {}  # hosts this run redeployed and has not put back yet
        self.unit_probe = systemd_unit_probe(plan.project, self.seams.transport)
        self.backend = plan.project.engine.backend  # which server dialect the services speak

    # ---- the loop ---------------------------------------------------------------------------

    def run(self, pick_best: Callable[[], SweepConfig | None]) -> SweepOutcome:
        """Sweep every host; put each back (or apply the chosen configuration) at the end.

        Args:
            pick_best: the recommendation from the cells so far (report.py), for `--apply best`.

        Returns:
            the outcome; the cells are in `self.state`.

        Raises:
            CheckFailed: a selected service is not healthy before the sweep starts (nothing was touched).
        """
        problems = preflight(self.plan.hosts, [self.plan.baseline, self.plan.tree], self.timeout_s, self.backend)
        if problems:
            raise CheckFailed(
                "sweep: not every service is healthy, so nothing was touched:\n  "
                + "\n  ".join(f"{p['host']}/{p['service']}: {p['message']}" for p in problems)
                + "\nrun `ddtree-ops healthcheck` for details, or `ddtree-ops deploy` to bring them up"
            )
        for host in self.plan.hosts:  # a service without the gauges could never be drained: refuse now
            check_gauges(service_url(host, self.plan.tree), self.backend)
        with self.seams.lock(list(self.plan.hosts)):
            return self._run_locked(pick_best)

    def _run_locked(self, pick_best: Callable[[], SweepConfig | None]) -> SweepOutcome:
        self.state.runs.append({"started_at": now_iso(), "resumed": bool(self.state.cells), "ended": None})
        for host in self.plan.hosts:
            if host.name not in self.state.original:  # a resumed sweep keeps what ran before its first run
                self.state.original[host.name] = self._running_config(host)
        self.state.save()
        try:
            for host in self.plan.hosts:
                try:
                    self._sweep_host(host)
                except DdtreeOpsError as err:  # a host that broke the sweep's own steps: put it back, go on
                    self.outcome.failures.append(_failure(host.name, self.plan.tree.name, f"sweep stopped on this host: {err}"))
                    self._put_back(host, self._original(host), "its configuration before the sweep")
                    continue
                if self.plan.apply is None:
                    self._put_back(host, self._original(host), "its configuration before the sweep")
        except KeyboardInterrupt:
            self.outcome.interrupted = True
            self.say("interrupted: putting every service this run changed back on its configuration before the sweep")
            for host in list(self.off_original.values()):  # with --apply, earlier hosts wait on their last configuration
                self._put_back(host, self._original(host), "its configuration before the sweep")
            self.outcome.failures.append(_failure(None, None, f"interrupted; continue with --resume {self.state.path.parent}"))
        else:
            if self.plan.apply is not None:
                self._apply(pick_best)
        self.state.runs[-1]["ended"] = "interrupted" if self.outcome.interrupted else "finished"
        self.state.runs[-1]["ended_at"] = now_iso()
        self.state.save()
        return self.outcome

    def _sweep_host(self, host: Host) -> None:
        for config in self.plan.configs:
            if self.state.finished(config.key, host.name):
                self.outcome.resumed_skipped.append(f"{config.key}/{host.name}")
                self.say(f"{host.name}: budget {config.budget}, topk {config.topk}: measured by an earlier run, not again")
                continue
            if host.name in self.dropped:
                self._record(self._new_cell(host, config), CELL_SKIPPED, f"not tried: {host.name} dropped out of the sweep")
                continue
            self._cell(host, config)

    def _apply(self, pick_best: Callable[[], SweepConfig | None]) -> None:
        chosen = pick_best() if self.plan.apply == APPLY_BEST else self.plan.apply
        if not isinstance(chosen, SweepConfig):
            self.outcome.failures.append(_failure(None, self.plan.tree.name, "--apply best: no lossless configuration "
                                                  "was measured on every host; services put back as they were"))  # fmt: skip
            for host in self.plan.hosts:
                self._put_back(host, self._original(host), "its configuration before the sweep")
            return
        why = "the recommendation" if self.plan.apply == APPLY_BEST else "named by --apply"
        self.outcome.applied = {"budget": chosen.budget, "topk": chosen.topk, "why": why}
        for host in self.plan.hosts:
            self._put_back(host, {"budget": chosen.budget, "topk": chosen.topk}, f"budget {chosen.budget}, topk {chosen.topk} ({why})")

    # ---- one cell ---------------------------------------------------------------------------

    def _new_cell(self, host: Host, config: SweepConfig) -> dict[str, Any]:
        return {
            "config": config.key, "budget": config.budget, "topk": config.topk, "host": host.name,
            "verify_width": config.verify_width, "block_size": self.plan.block_size, "status": None,
            "started_at": now_iso(), "error": None,
        }  # fmt: skip

    def _record(self, cell: dict[str, Any], status: str, error: str | None = None) -> None:
        cell["status"], cell["ended_at"] = status, now_iso()
        if error:
            cell["error"] = error
            if status == CELL_FAILED:
                self.outcome.failures.append(_failure(cell["host"], self.plan.tree.name, f"budget {cell['budget']}, topk {cell['topk']}: {error}"))
        self.state.record(cell)

    def _cell(self, host: Host, config: SweepConfig) -> None:
        tree, url = self.plan.tree.name, service_url(host, self.plan.tree)
        cell = self._new_cell(host, config)
        self.say(f"{host.name}/{tree}: budget {config.budget}, topk {config.topk}: draining")
        drained = self._drain(host)
        cell["drain_waited_s"] = round(drained.waited_s, 3)
        if not drained.drained:
            return self._record(cell, CELL_FAILED, f"not drained: {drained.in_flight} request(s) still in flight after "
                                f"{self.drain_timeout_s:g}s; the service was left as it was, not redeployed")  # fmt: skip
        self.say(f"{host.name}/{tree}: deploying budget {config.budget}, topk {config.topk} (health-gated)")
        self.off_original[host.name] = host
        project, report = self._deploy(host, config.budget, config.topk)
        outcome = next((s for h in report.hosts for s in h.services if s.service == tree), None)
        cell["deploy_id"] = report.deploy_id
        cell["release_id"] = outcome.release_id if outcome else None
        cell["healthy_after_s"] = outcome.healthy_after_s if outcome else None
        if not report.ok:
            self._record(cell, CELL_FAILED, f"the deploy's health gate failed (rolled back):\n{report.failure}")
            return self._settle(host)
        # Healthy means warm (the engine answers 503 until its warm-up is done); nothing in flight
        # means no warm-up or stray request is still running when measuring starts.
        with ServiceClient(url, timeout_s=10, backend=self.backend) as client:
            status = client.health_status()
        idle = self._drain(host)
        cell["ready_at"], cell["health_status_at_ready"], cell["in_flight_at_ready"] = now_iso(), status, idle.in_flight
        if status != 200 or not idle.drained:
            self._record(cell, CELL_FAILED, f"not ready after the deploy: /health {status}, in flight {idle.in_flight}")
            return self._settle(host)
        self.say(f"{host.name}/{tree}: measuring budget {config.budget}, topk {config.topk}")
        try:
            compared = run_compare(
                project, self.prompts, baseline=self.plan.baseline.name, tree=tree, runs=self.plan.runs,
                max_tokens=self.plan.max_tokens, host_names=[host.name], timeout_s=self.timeout_s, progress=self.say,
            )  # fmt: skip
        except CheckFailed as err:
            self._record(cell, CELL_FAILED, f"{err}\n{self._journal(host)}")
            return self._settle(host)
        cell["measured_at"] = now_iso()
        cell.update(cell_figures(compared, host.name))
        request_failures = [f["message"] for f in compared.failures if f["service"] is not None]
        self.outcome.warnings += [f"budget {config.budget}, topk {config.topk}: {w}" for w in compared.warnings
                                  if not w.startswith("--runs 1")]  # fmt: skip
        if request_failures:
            self._record(cell, CELL_FAILED, "; ".join(request_failures) + f"\n{self._journal(host)}")
            return self._settle(host)
        self._record(cell, CELL_OK)
        self.state.current[host.name] = {"budget": config.budget, "topk": config.topk, "release_id": cell["release_id"]}

    # ---- putting services on a known configuration --------------------------------------------

    def _deploy(self, host: Host, budget: int, topk: int):
        dplan = plan_deploy(self.plan.project, budget=budget, topk=topk, services=[self.plan.tree.name], hosts=[host.name])
        report = execute_deploy(
            dplan, progress=self.say, run_playbook=self.seams.run_playbook, unit_probe=self.unit_probe,
            env_gate=stored_manifest_gate(dplan.project, self.seams.transport),
        )  # fmt: skip
        return dplan.project, report

    def _put_back(self, host: Host, target: dict[str, Any], what: str) -> None:
        """Drain, then deploy `target` (budget/topk) on `host`; record what the service runs afterwards."""
        if host.name in self.dropped and not self._answers_health(host):
            self.outcome.failures.append(_failure(host.name, self.plan.tree.name, "left on an unknown configuration: "
                                                  "the service is down; run `ddtree-ops deploy` on that host"))  # fmt: skip
            return
        self.say(f"{host.name}/{self.plan.tree.name}: putting back {what}")
        drained = self._drain(host)
        if not drained.drained:
            message = f"not put back on {what}: {drained.in_flight} request(s) still in flight after {self.drain_timeout_s:g}s"
            self.outcome.failures.append(_failure(host.name, self.plan.tree.name, message))
            self._settle(host, redeploy=False)
            return
        _project, report = self._deploy(host, target["budget"], target["topk"])
        self.off_original.pop(host.name, None)
        if not report.ok:
            self.outcome.failures.append(_failure(host.name, self.plan.tree.name, f"not put back on {what}: {report.failure}"))
        self._settle(host, redeploy=False)

    def _settle(self, host: Host, redeploy: bool = True) -> None:
        """After a failure: wait for the service to be healthy and note what it runs; when it does not
        come back, redeploy its configuration from before the sweep; when that fails too, drop the host."""
        if self._healthy(host):
            return self._note_current(host)
        if redeploy:
            original = self._original(host)
            self.say(f"{host.name}/{self.plan.tree.name}: not healthy: redeploying budget {original['budget']}, topk {original['topk']}")
            _project, report = self._deploy(host, original["budget"], original["topk"])
            if report.ok and self._healthy(host):
                return self._note_current(host)
        self.dropped.add(host.name)
        self.state.current[host.name] = {"budget": None, "topk": None, "release_id": None, "healthy": False}
        self.state.save()
        self.outcome.failures.append(_failure(host.name, self.plan.tree.name, "the service did not come back healthy: "
                                              "this host dropped out of the sweep; see `ddtree-ops healthcheck`"))  # fmt: skip

    def _answers_health(self, host: Host) -> bool:
        # One probe: a dropped host already had the whole health timeout to come back.
        with ServiceClient(service_url(host, self.plan.tree), timeout_s=10, backend=self.backend) as client:
            try:
                return client.health_status() == 200
            except httpx.HTTPError:
                return False

    def _healthy(self, host: Host) -> bool:
        target = GateTarget(host.name, self.plan.tree.name, service_url(host, self.plan.tree), None, self.backend)
        settings = self.plan.project.deploy
        gate = wait_healthy([target], timeout_s=settings.health_timeout_s, interval_s=settings.health_interval_s,
                            unit_probe=self.unit_probe)  # fmt: skip
        return gate[self.plan.tree.name].healthy

    def _note_current(self, host: Host) -> None:
        now = self._running_config(host)
        self.state.current[host.name] = {**now, "healthy": True}
        self.state.save()
        self.say(f"{host.name}/{self.plan.tree.name}: now on budget {now['budget']}, topk {now['topk']} (release {now['release_id']})")

    def _drain(self, host: Host):
        return wait_drained(service_url(host, self.plan.tree), self.drain_timeout_s, backend=self.backend)

    def _original(self, host: Host) -> dict[str, Any]:
        return self.state.original[host.name]

    def _running_config(self, host: Host) -> dict[str, Any]:
        """budget/topk from the tree service's /server_info, and its release id from the host's state.json."""
        with ServiceClient(service_url(host, self.plan.tree), timeout_s=30, backend=self.backend) as client:
            try:
                info = client.server_info()
            except (httpx.HTTPError, ValueError) as err:
                raise CheckFailed(f"{host.name}/{self.plan.tree.name}: /server_info: {err}") from None
        return {
            "budget": info.get("speculative_ddtree_budget"),
            "topk": info.get("speculative_ddtree_topk"),
            "release_id": self._release_id(host),
        }

    def _release_id(self, host: Host) -> str | None:
        try:
            text = self.seams.transport.run(host, f"cat {STATE_PATH}", timeout_s=30)
            entry = service_entries(json.loads(text)).get(self.plan.tree.name) or {}
        except (DdtreeOpsError, ValueError):
            return None
        return entry.get(STATE_CURRENT)

    def _journal(self, host: Host) -> str:
        unit = unit_name(self.plan.tree.name)
        try:
            proc = self.seams.transport.exec(host, f"journalctl -u {unit} -n {JOURNAL_LINES} --no-pager", timeout_s=30)
        except DdtreeOpsError as err:
            return f"(no journal: {err})"
        return f"last journal lines of {unit}:\n{proc.stdout.strip()}"


def cell_figures(report: CompareReport, host: str) -> dict[str, Any]:
    """One host's measurement of one configuration, from compare's report: medians over prompts of
    the tree arm's figures, the baseline's beside them, the geomean speedup, the lossless verdict."""
    rows = [s for s in report.summaries if s.host == host]
    return {
        "speedup": report.totals.host_speedup.get(host),
        "tree_tps": median(s.tree.decode_tps for s in rows),
        "baseline_tps": median(s.baseline.decode_tps for s in rows),
        "tokens_per_step": median(s.tree.accept_length for s in rows),
        "baseline_tokens_per_step": median(s.baseline.accept_length for s in rows),
        "ttft_s": median(s.tree.ttft_s for s in rows),
        "baseline_ttft_s": median(s.baseline.ttft_s for s in rows),
        "lossless": bool(rows) and all(s.lossless.ok for s in rows),
        "prompts": [
            {"prompt": s.prompt, "speedup": s.speedup, "tree_tps": s.tree.decode_tps, "baseline_tps": s.baseline.decode_tps,
             "tokens_per_step": s.tree.accept_length, "ttft_s": s.tree.ttft_s, "lossless": s.lossless.ok,
             "lossless_detail": s.lossless.detail}
            for s in rows
        ],
    }  # fmt: skip
