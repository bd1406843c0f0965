"""Drain: wait until a service holds no request, read from the server's own gauges in `/metrics`.

A restart while a request is in flight kills that request (and, on the original deployment, the
server: the next configuration started while the last warm-up request was still running). Both
engine backends expose SGLang's gauges of the requests running and queued now; the sweep waits
for their sum to read 0 before it redeploys a service, and again before it measures one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from ..exceptions import CheckFailed
from ..service.client import ServiceClient
from ..service.metrics_text import Metrics

RUNNING_REQUESTS = "sglang:num_running_reqs"
QUEUED_REQUESTS = "sglang:num_queue_reqs"
DRAIN_INTERVAL_S = 0.5


class NoInFlightGauge(CheckFailed):
    """The service answers `/metrics` without the in-flight gauges: draining it cannot be verified."""


def in_flight(metrics: Metrics) -> int | None:
    """Requests running plus queued on a server, or None when it exposes neither gauge.

    Every series is summed: SGLang with priority scheduling writes per-priority series beside the total,
    which may count a request twice, but the sum is 0 exactly when every series is, and 0 is all a
    drain asks."""
    running, queued = metrics.total(RUNNING_REQUESTS), metrics.total(QUEUED_REQUESTS)
    if running is None and queued is None:
        return None
    return int((running or 0) + (queued or 0))


@dataclass(frozen=True)
class DrainResult:
    drained: bool
    waited_s: float
    in_flight: int | None  # at the last scrape; None when the service did not answer
    note: str = ""  # "not answering" when nothing could be in flight because nothing listens


def wait_drained(
    url: str,
    timeout_s: float,
    *,
    interval_s: float = DRAIN_INTERVAL_S,
    backend: str = "reference",
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> DrainResult:
    """Poll `url`'s `/metrics` until no request is running or queued, or `timeout_s` passes.

    Args:
        url: the service's base URL.
        timeout_s: the longest wait.
        interval_s: pause between scrapes.
        backend: the project's engine.backend (the server's dialect).
        clock, sleep: seams (the real clock by default).

    Returns:
        drained (and after how long), or not drained with the count still in flight at the timeout.
        A service that refuses the connection holds no request: drained, with a note.

    Raises:
        NoInFlightGauge: the server answers without `sglang:num_running_reqs`/`sglang:num_queue_reqs`.
    """
    started = clock()
    last: int | None = None
    with ServiceClient(url, timeout_s=min(timeout_s, 10.0), backend=backend) as client:
        while True:
            try:
                count = in_flight(client.metrics())
            except httpx.ConnectError:
                return DrainResult(True, clock() - started, None, "not answering: nothing in flight")
            except (httpx.HTTPError, ValueError):
                count = last  # a slow or half-started server: ask again until the timeout
            else:
                if count is None:
                    raise NoInFlightGauge(
                        f"{url}/metrics has neither {RUNNING_REQUESTS} nor {QUEUED_REQUESTS}, so a sweep cannot tell "
                        "when no request is in flight: upgrade the engine on that host (`ddtree-ops provision`, then deploy)"
                    )
                if count == 0:
                    return DrainResult(True, clock() - started, 0)
            last = count
            if clock() - started >= timeout_s:
                return DrainResult(False, clock() - started, last)
            sleep(interval_s)


def check_gauges(url: str, backend: str = "reference") -> None:
    """One scrape of `url`'s `/metrics`: refuse a server without the in-flight gauges before anything
    is touched (a service that does not answer is left to the health checks).

    Raises:
        NoInFlightGauge: the server answers without `sglang:num_running_reqs`/`sglang:num_queue_reqs`.
    """
    with ServiceClient(url, timeout_s=10.0, backend=backend) as client:
        try:
            metrics = client.metrics()
        except (httpx.HTTPError, ValueError):
            return
    if in_flight(metrics) is None:
        raise NoInFlightGauge(
            f"{url}/metrics has neither {RUNNING_REQUESTS} nor {QUEUED_REQUESTS}, so a sweep cannot tell when no "
            "request is in flight; nothing was touched: upgrade the engine on that host (`ddtree-ops provision`, then deploy)"
        )
