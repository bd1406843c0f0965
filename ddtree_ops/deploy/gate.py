"""The health gate: poll services until `/health` answers 200, then check `/server_info`.

It takes what it needs of each service — a `GateTarget`: host and service names, base URL, and the
`/server_info` values it must report (None: do not check, as after a rollback to an older release) —
and talks to the service through the same client healthcheck uses (`service.client.ServiceClient`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from ..config import DeploySettings, Project
from ..exceptions import DdtreeOpsError
from ..hosts.layout import unit_name
from ..hosts.ssh import SSH, Transport
from ..progress import Progress
from ..service import server_info
from ..service.client import ServiceClient

UNIT_PROBE_INTERVAL_S = 5.0
UNREACHABLE_PROBES = 3  # unit probes in a row that found the host unreachable over SSH: it is down
UNIT_PROBE_PROPERTIES = ("ActiveState", "SubState", "Result", "NRestarts", "StartLimitBurst", "StartLimitIntervalUSec")


@dataclass(frozen=True)
class GateTarget:
    """One service on one host, as the gate sees it."""

    host: str
    service: str
    url: str  # http://address:port
    expected_info: dict[str, Any] | None  # what /server_info must report; None = /health only
    backend: str = "reference"  # engine.backend: which server dialect it speaks (service/dialect.py)


@dataclass
class GateResult:
    healthy: bool
    healthy_after_s: float | None
    reason: str = ""


# Returns why systemd gave up on a service's unit (e.g. "unit ddtree-tree.service failed after
# 5 restarts"), or None while it is still starting, running or about to restart.
UnitProbe = Callable[[GateTarget], "str | None"]
# Makes the client of one service (base URL, per-request timeout, engine backend).
Connect = Callable[[str, float, str], ServiceClient]


def wait_healthy(
    targets: list[GateTarget],
    *,
    timeout_s: float,
    interval_s: float,
    progress: Progress | None = None,
    unit_probe: UnitProbe | None = None,
    connect: Connect = ServiceClient,
) -> dict[str, GateResult]:
    """Poll every service's `/health` until it answers 200 or `timeout_s` passes, then check `/server_info`.

    Args:
        targets: the services to wait for (all on one host, in practice).
        timeout_s, interval_s: the whole wait, and the pause between polls.
        progress: called with a line when a service turns healthy.
        unit_probe: asked every UNIT_PROBE_INTERVAL_S for the unit's state: a unit systemd gave up on
            (start limit hit) fails at once instead of after the whole timeout.
        connect: makes each service's client (tests may pass their own).
    Returns:
        one GateResult per service name. All services are polled together, so a host costs one timeout at most.
    """
    request_timeout = min(10.0, max(interval_s, 2.0))
    clients = {t.service: connect(t.url, request_timeout, t.backend) for t in targets}
    start = time.monotonic()
    results: dict[str, GateResult] = {}
    last_seen: dict[str, str] = {t.service: "no answer yet" for t in targets}
    pending = list(targets)
    next_unit_probe = start + UNIT_PROBE_INTERVAL_S
    try:
        while pending:
            for target in list(pending):
                try:
                    status = clients[target.service].health_status()
                    last_seen[target.service] = f"/health answered {status}"
                    if status == 200:
                        results[target.service] = GateResult(True, round(time.monotonic() - start, 1))
                        pending.remove(target)
                        if progress:
                            progress(
                                f"{target.host}/{target.service}: healthy after {results[target.service].healthy_after_s}s"
                            )
                except httpx.HTTPError as err:
                    last_seen[target.service] = f"/health: {type(err).__name__}: {err}"
            if not pending:
                break
            if unit_probe is not None and time.monotonic() >= next_unit_probe:
                next_unit_probe = time.monotonic() + UNIT_PROBE_INTERVAL_S
                for target in list(pending):
                    given_up = unit_probe(target)
                    if given_up:
                        results[target.service] = GateResult(
                            False, None, f"{given_up} before /health answered 200 (last: {last_seen[target.service]})"
                        )
                        pending.remove(target)
                if not pending:
                    break
            if time.monotonic() - start >= timeout_s:
                for target in pending:
                    results[target.service] = GateResult(
                        False,
                        None,
                        f"/health at {target.url} did not answer 200 within {timeout_s:g}s "
                        f"(last: {last_seen[target.service]})",
                    )
                break
            time.sleep(interval_s)

        for target in targets:
            if target.expected_info is None or not results[target.service].healthy:
                continue
            try:
                info = clients[target.service].server_info()
            except (httpx.HTTPError, ValueError) as err:
                results[target.service] = GateResult(False, None, f"/server_info failed: {err}")
                continue
            problems = server_info.mismatches(target.expected_info, info)
            if problems:
                results[target.service] = GateResult(
                    False,
                    results[target.service].healthy_after_s,
                    "/server_info does not match the deploy: " + "; ".join(problems),
                )
    finally:
        for client in clients.values():
            client.close()
    return results


def wait_restored(
    targets: list[GateTarget], settings: DeploySettings, say: Progress | None, unit_probe: UnitProbe | None
) -> dict[str, GateResult]:
    """Health of services put back on an older release: /health only, since their
    /server_info is the old release's, not this rollout's."""
    return wait_healthy(
        [GateTarget(t.host, t.service, t.url, None, t.backend) for t in targets],
        timeout_s=settings.health_timeout_s,
        interval_s=settings.health_interval_s,
        progress=say,
        unit_probe=unit_probe,
    )


def systemd_unit_probe(project: Project, transport: Transport = SSH) -> UnitProbe:
    """A UnitProbe that asks the host's systemd over SSH (read-only).

    One SSH failure is no verdict (a blip must not fail a deploy); UNREACHABLE_PROBES in a row
    (about UNREACHABLE_PROBES × UNIT_PROBE_INTERVAL_S seconds, while /health does not answer 200
    either) mean the host is down or cut off, and the gate stops waiting for it.

    Args:
        project: names the hosts.
        transport: the SSH seam.
    Returns:
        the probe.
    """
    misses: dict[tuple[str, str], int] = {}  # (host, service) -> SSH failures in a row

    def probe(target: GateTarget) -> str | None:
        unit = unit_name(target.service)
        try:
            text = transport.run(
                project.host(target.host), f"systemctl show -p {','.join(UNIT_PROBE_PROPERTIES)} {unit}", timeout_s=20
            )
        except DdtreeOpsError as err:
            key = (target.host, target.service)
            misses[key] = misses.get(key, 0) + 1
            if misses[key] >= UNREACHABLE_PROBES and "unreachable" in str(err):
                return f"host {target.host} stopped answering (SSH and HTTP) while {unit} was starting: {err}"
            return None
        misses[(target.host, target.service)] = 0
        return unit_given_up(unit, dict(line.split("=", 1) for line in text.splitlines() if "=" in line))

    return probe


def unit_given_up(unit: str, props: dict[str, str]) -> str | None:
    """Why systemd gave up on `unit`, from `systemctl show` properties; None while it may still come up.

    A unit that crash-looped into its start limit says so with the limit (StartLimitBurst starts
    within StartLimitIntervalSec): systemd will not start it again by itself. systemd reports that as
    Result=start-limit-hit, or (on the restart path, systemd 252+) keeps the last crash's result
    (exit-code) with as many automatic restarts as the burst allows.
    """
    state, sub, result = props.get("ActiveState"), props.get("SubState"), props.get("Result", "")
    # Between crash and restart the unit is activating/auto-restart: still worth waiting for.
    if not (state == "failed" or (state == "inactive" and sub == "dead")):
        return None
    restarts, burst = props.get("NRestarts", "?"), props.get("StartLimitBurst", "?")
    hit = result == "start-limit-hit" or (
        state == "failed" and restarts.isdigit() and burst.isdigit() and int(burst) > 0 and int(restarts) >= int(burst)
    )
    why = f", Result={result}" if result and result != "success" else ""
    if hit:
        limit = f"StartLimitBurst={burst} starts within StartLimitIntervalSec={props.get('StartLimitIntervalUSec', '?')}"
        return (
            f"systemd gave up on {unit}: it crash-looped into its start limit ({limit}; "
            f"{restarts} restarts{why}) and will not restart it again"
        )
    return f"systemd gave up on {unit} ({state}/{sub} after {restarts} restarts{why})"
