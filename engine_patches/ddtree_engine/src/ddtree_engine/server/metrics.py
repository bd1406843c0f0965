"""Server counters in Prometheus text format and the `DDTREE metrics:` journal line.

The metric names are SGLang's (`sglang:generation_tokens_total`, ...) so the health gate and the
compare tool read both backends the same way; `ddtree:*` are this engine's extras.

Acceptance length, everywhere it is shown, is committed tokens per verify step: the accepted
drafts plus the bonus token of each step, counted from the steps themselves. The first token of
a request comes from the prefill, not from a verify step, so it is not part of it (counting it
would put an `ar` service above 1 and favour the arm with fewer steps); `ar` reads exactly 1.

The exposition is written by `prometheus_client` (what SGLang serves `/metrics` with), so the
types, the `_total` naming and the label escaping are the library's, not ours.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..types import GenerationResult, StepStats

JOURNAL_PREFIX = "DDTREE metrics:"

# (name, type, help) in exposition order; the counters are fields of MetricsSnapshot.
_COUNTERS = (
    ("sglang:prompt_tokens_total", "prompt_tokens", "Prompt tokens processed."),
    ("sglang:generation_tokens_total", "generation_tokens", "Tokens generated (prefill token included)."),
    ("sglang:num_requests_total", "num_requests", "Generation requests finished."),
    ("sglang:spec_verify_calls_total", "spec_verify_calls", "Target verify forwards (one per step)."),
    ("ddtree:tree_nodes_total", "tree_nodes", "Drafted nodes verified, roots excluded."),
    ("ddtree:accepted_drafts_total", "accepted_drafts", "Drafted tokens the target accepted."),
    (
        "ddtree:verify_committed_tokens_total",
        "verify_committed_tokens",
        "Tokens committed by verify steps (accepted drafts + one bonus token each); the prefill's token excluded.",
    ),
)
ACCEPT_LENGTH_HELP = (
    "Committed tokens per verify step over the server's lifetime (accepted drafts + the bonus token; "
    "the prefill's token excluded, so ar reads 1): "
    "ddtree:verify_committed_tokens_total / sglang:spec_verify_calls_total."
)


@dataclass(frozen=True)
class MetricsSnapshot:
    """Lifetime counters at one instant."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_requests: int = 0
    spec_verify_calls: int = 0
    tree_nodes: int = 0
    accepted_drafts: int = 0
    verify_committed_tokens: int = 0  # tokens committed by verify steps; generation_tokens - num_requests

    @property
    def spec_accept_length(self) -> float:
        """Committed tokens per verify step over the server's lifetime, prefill excluded (0 before the first)."""
        if self.spec_verify_calls == 0:
            return 0.0
        return self.verify_committed_tokens / self.spec_verify_calls


def format_journal_line(steps: Sequence[StepStats], budget: int, batch_size: int = 1) -> str:
    """The `DDTREE metrics:` line operators grep for, averaged over `steps`.

    Args:
        steps: the verify steps since the previous line (at least one).
        budget: the configured tree budget (drafted nodes per step).
        batch_size: requests per verify forward (this server runs 1).

    Returns:
        e.g. `DDTREE metrics: bs=1 budget=15 avg_actual_nodes=16.00 avg_accepted_drafts=6.00
        avg_commit_len=7.00 avg_accepted_depth=6.00` (one line; nodes count the root).
        `avg_commit_len` is the acceptance length of these steps (committed tokens per verify
        step, prefill excluded), the definition `sglang:spec_accept_length` uses.
    """
    if not steps:
        raise ValueError("expected at least one verify step, got none")
    count = len(steps)
    avg_nodes = sum(s.tree_nodes + 1 for s in steps) / count
    avg_accepted = sum(s.accepted_drafts for s in steps) / count
    avg_commit = sum(s.committed for s in steps) / count
    return (
        f"{JOURNAL_PREFIX} bs={batch_size} budget={budget} avg_actual_nodes={avg_nodes:.2f} "
        f"avg_accepted_drafts={avg_accepted:.2f} avg_commit_len={avg_commit:.2f} "
        f"avg_accepted_depth={avg_accepted:.2f}"
    )


class SnapshotCollector:
    """A prometheus_client collector that reads every value from one MetricsSnapshot per scrape.

    A collector rather than Counter/Gauge objects with `inc()` calls in `record`: one scrape reads
    one snapshot taken under ServerMetrics' lock, so the gauge always equals the ratio of the
    counters beside it (separate Counters, each with its own lock, could be read between two
    `inc()`s of one request); the gauge is derived, not set; and no `*_created` series appear,
    as in SGLang's own exposition (multiprocess mode emits none), without the process-wide
    `disable_created_metrics()` switch. Counters are named with their `_total` suffix:
    prometheus_client strips it from the family name and writes it back on the sample, so the
    exposed names are exactly the ones given here.
    """

    def __init__(self, read_snapshot: Callable[[], MetricsSnapshot], model_name: str) -> None:
        self._read_snapshot = read_snapshot
        self._labels = [model_name]

    def collect(self) -> Iterator[Metric]:
        snapshot = self._read_snapshot()
        for name, field_name, help_text in _COUNTERS:
            counter = CounterMetricFamily(name, help_text, labels=["model_name"])
            counter.add_metric(self._labels, float(getattr(snapshot, field_name)))
            yield counter
        gauge = GaugeMetricFamily("sglang:spec_accept_length", ACCEPT_LENGTH_HELP, labels=["model_name"])
        gauge.add_metric(self._labels, snapshot.spec_accept_length)
        yield gauge


# SGLang's names for the requests a server holds right now: `ddtree-ops sweep` drains a service
# (waits for both to read 0) before it restarts it, so a restart never cuts a request off.
RUNNING_REQUESTS = "sglang:num_running_reqs"
QUEUED_REQUESTS = "sglang:num_queue_reqs"


class InFlight:
    """Thread-safe gauges of the requests generating now and of those waiting for the engine."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0
        self.queued = 0

    def _add(self, running: int, queued: int) -> None:
        with self._lock:
            self.running += running
            self.queued += queued

    def enqueue(self) -> None:
        self._add(0, 1)

    def start(self) -> None:
        """A queued request got the engine."""
        self._add(1, -1)

    def finish(self, started: bool) -> None:
        """A request left: it ran (`started`) or gave up while queued."""
        if started:
            self._add(-1, 0)
        else:
            self._add(0, -1)

    def read(self) -> tuple[int, int]:
        with self._lock:
            return self.running, self.queued


class InFlightCollector:
    """`sglang:num_running_reqs` and `sglang:num_queue_reqs` from one InFlight, read per scrape."""

    def __init__(self, in_flight: InFlight, model_name: str) -> None:
        self._in_flight = in_flight
        self._labels = [model_name]

    def collect(self) -> Iterator[Metric]:
        running, queued = self._in_flight.read()
        for name, value, help_text in (
            (RUNNING_REQUESTS, running, "Requests generating now (the warm-up included)."),
            (QUEUED_REQUESTS, queued, "Requests waiting for the engine."),
        ):
            gauge = GaugeMetricFamily(name, help_text, labels=["model_name"])
            gauge.add_metric(self._labels, float(value))
            yield gauge


class LoadCounters:
    """Thread-safe counts of the requests the server turned away or cut short, and its queue limit."""

    FIELDS = ("rejected", "timeouts", "disconnects")

    def __init__(self, max_queue: int) -> None:
        self._lock = threading.Lock()
        self.max_queue = max_queue
        self._counts = dict.fromkeys(self.FIELDS, 0)

    def add(self, field_name: str) -> None:
        with self._lock:
            self._counts[field_name] += 1

    def read(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


_LOAD_COUNTERS = (
    ("ddtree:requests_rejected_total", "rejected", "Requests refused with 429 because the queue was full."),
    ("ddtree:request_timeouts_total", "timeouts", "Requests answered 504: queued or generating past the timeout."),
    ("ddtree:client_disconnects_total", "disconnects", "Requests whose client went away before the answer."),
)


class LoadCollector:
    """The LoadCounters as `ddtree:*_total` counters plus the `ddtree:max_queue` gauge, read per scrape."""

    def __init__(self, counters: LoadCounters, model_name: str) -> None:
        self._counters = counters
        self._labels = [model_name]

    def collect(self) -> Iterator[Metric]:
        counts = self._counters.read()
        for name, field_name, help_text in _LOAD_COUNTERS:
            counter = CounterMetricFamily(name, help_text, labels=["model_name"])
            counter.add_metric(self._labels, float(counts[field_name]))
            yield counter
        gauge = GaugeMetricFamily("ddtree:max_queue", "Requests allowed to wait for the engine (--max-queue).",
                                  labels=["model_name"])
        gauge.add_metric(self._labels, float(self._counters.max_queue))
        yield gauge


def metrics_registry(
    read_snapshot: Callable[[], MetricsSnapshot], model_name: str, in_flight: InFlight | None = None
) -> CollectorRegistry:
    """A registry of its own (not prometheus_client's global one: several apps share a test process).

    Args:
        read_snapshot: called once per scrape, e.g. `ServerMetrics.snapshot`.
        model_name: the `model_name` label on every series, as SGLang labels them.
        in_flight: the server's request gauges (None: not exposed).

    Returns:
        a CollectorRegistry holding one SnapshotCollector (and an InFlightCollector); pass it to
        `generate_latest`.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(read_snapshot, model_name))
    if in_flight is not None:
        registry.register(InFlightCollector(in_flight, model_name))
    return registry


def render_prometheus(snapshot: MetricsSnapshot, model_name: str) -> str:
    """Prometheus text exposition (version 0.0.4) of `snapshot`, labelled like SGLang's.

    Args:
        snapshot: the counters to expose.
        model_name: the `model_name` label value (escaped by prometheus_client).

    Returns:
        the text `/metrics` serves to a client that asks for no other format.
    """
    return generate_latest(metrics_registry(lambda: snapshot, model_name)).decode("utf-8")


def _write_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ServerMetrics:
    """Thread-safe lifetime counters plus the journal line every `log_interval` verify steps."""

    def __init__(
        self,
        budget: int,
        log_interval: int = 32,
        log_sink: Callable[[str], None] = _write_stderr,
    ) -> None:
        if log_interval < 1:
            raise ValueError(f"expected metrics log interval >= 1, got {log_interval}")
        self.budget = budget
        self.log_interval = log_interval
        self._log_sink = log_sink
        self._lock = threading.Lock()
        self._snapshot = MetricsSnapshot()
        self._pending_steps: list[StepStats] = []

    def record(self, result: GenerationResult) -> None:
        """Add one finished request; writes a journal line for each full window of steps."""
        lines: list[str] = []
        with self._lock:
            s = self._snapshot
            self._snapshot = MetricsSnapshot(
                prompt_tokens=s.prompt_tokens + result.prompt_tokens,
                generation_tokens=s.generation_tokens + len(result.token_ids),
                num_requests=s.num_requests + 1,
                spec_verify_calls=s.spec_verify_calls + len(result.steps),
                tree_nodes=s.tree_nodes + sum(st.tree_nodes for st in result.steps),
                accepted_drafts=s.accepted_drafts + sum(st.accepted_drafts for st in result.steps),
                verify_committed_tokens=s.verify_committed_tokens + sum(st.committed for st in result.steps),
            )
            for step in result.steps:
                self._pending_steps.append(step)
                if len(self._pending_steps) == self.log_interval:
                    lines.append(format_journal_line(self._pending_steps, self.budget))
                    self._pending_steps = []
        for line in lines:
            self._log_sink(line)

    def snapshot(self) -> MetricsSnapshot:
        with self._lock:
            return self._snapshot
