"""Reading Prometheus text exposition (what `/metrics` returns on both engine backends).

Parsed by `prometheus_client`'s own text parser (the library both backends write it with), so
label escaping, `# HELP`/`# TYPE` handling and the special values are the library's. Only the
samples are kept: names, labels and values, in order of appearance; timestamps are dropped.
SGLang labels every series (`model_name=…`, per rank), so values are read by metric name with
the label sets summed. `*_created` samples, which prometheus_client writes for counters outside
multiprocess mode (SGLang runs in multiprocess mode and writes none), are samples of their own
name and never add to a counter's total.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.parser import text_fd_to_metric_families

# Metric names the tools read (SGLang's names; the reference server uses the same ones).
GENERATION_TOKENS = "sglang:generation_tokens_total"
PROMPT_TOKENS = "sglang:prompt_tokens_total"
NUM_REQUESTS = "sglang:num_requests_total"
SPEC_VERIFY_CALLS = "sglang:spec_verify_calls_total"
SPEC_ACCEPT_LENGTH = "sglang:spec_accept_length"
# The DDTree engine's own counter of tokens committed by verify steps (SGLang has no such counter).
VERIFY_COMMITTED_TOKENS = "ddtree:verify_committed_tokens_total"
RUNNING_REQUESTS = "sglang:num_running_reqs"

# The one definition of acceptance every tool shows (tables, JSON, Markdown).
ACCEPT_DEFINITION = "accept = committed tokens per verify step, prefill excluded"
# Where a figure came from (`Acceptance.source`).
SOURCE_COMMITTED = "verify_committed_tokens"  # ddtree:verify_committed_tokens_total / verify calls
SOURCE_TOKENS_MINUS_REQUESTS = "generation_minus_requests"  # (generation tokens - requests) / verify calls
SOURCE_GAUGE = "spec_accept_length_gauge"  # the server's own gauge, taken as it is


class MetricsParseError(ValueError):
    """A line of the exposition that prometheus_client's text parser rejects."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Metrics:
    """One scrape of `/metrics`."""

    samples: list[Sample] = field(default_factory=list)

    def names(self) -> set[str]:
        return {s.name for s in self.samples}

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.samples)

    def total(self, name: str) -> float | None:
        """The sum over every label set of `name`, or None when the metric is absent."""
        values = [s.value for s in self.samples if s.name == name]
        if not values:
            return None
        return math.fsum(values)

    def mean(self, name: str) -> float | None:
        """A gauge's value, averaged over its series (SGLang exports one per rank); None when absent."""
        values = [s.value for s in self.samples if s.name == name]
        if not values:
            return None
        return math.fsum(values) / len(values)


def _numbered_lines(text: str, position: list[int]) -> Iterator[str]:
    # The parser reads its input line by line as it yields families; counting the lines handed
    # to it tells which one it was reading when it raised (its messages name no line).
    for line_no, line in enumerate(text.splitlines(), start=1):
        position[0] = line_no
        yield line


def parse_metrics(text: str) -> Metrics:
    """Parse Prometheus text format (0.0.4, what SGLang and the reference server answer by default).

    Args:
        text: the body of a `/metrics` response.

    Returns:
        every sample in order of appearance, values as floats. A counter typed without the
        `_total` suffix is read under `name_total`, as prometheus_client names counter samples.

    Raises:
        MetricsParseError: naming the first line prometheus_client's parser rejects and why.
    """
    position = [0]
    samples: list[Sample] = []
    try:
        for family in text_fd_to_metric_families(_numbered_lines(text, position)):  # type: ignore[arg-type]
            samples += [Sample(s.name, dict(s.labels), float(s.value)) for s in family.samples]
    except ValueError as err:
        line_no = position[0]
        raw = text.splitlines()[line_no - 1] if line_no else ""
        reason = str(err) or "not valid Prometheus text"
        raise MetricsParseError(f"line {line_no}: {reason}: {raw!r}") from None
    return Metrics(samples)


def counter_delta(before: Metrics, after: Metrics, name: str) -> float | None:
    """How much a counter grew between two scrapes; None when either lacks it.

    A counter that went down means the server restarted in between: that delta is meaningless,
    so it is reported as None rather than as a negative number.
    """
    a, b = before.total(name), after.total(name)
    if a is None or b is None or b < a:
        return None
    return b - a


@dataclass(frozen=True)
class Acceptance:
    """An acceptance length and how it was obtained.

    `value` is committed tokens per verify step, the prefill's token excluded (`ar` reads 1.0);
    None when there was no verify step or the server lacks the counters. `source` is one of the
    SOURCE_* names, None with no value.
    """

    value: float | None = None
    source: str | None = None


def _committed_by_verify(
    committed: float | None, generated: float | None, requests: float | None
) -> tuple[float | None, str | None]:
    # The engine's own counter first. Without it (SGLang's own servers, DDTree engines before the
    # counter existed): every finished request's first token comes from its prefill, not from a
    # verify step, so generated - finished requests = tokens committed by verify steps. Exact
    # when no request is in flight at either scrape (SGLang counts both at request finish).
    if committed is not None:
        return committed, SOURCE_COMMITTED
    if generated is not None and requests is not None:
        return generated - requests, SOURCE_TOKENS_MINUS_REQUESTS
    return None, None


def accept_length_delta(before: Metrics, after: Metrics) -> Acceptance:
    """Committed tokens per verify step between two scrapes, prefill excluded (ACCEPT_DEFINITION).

    Args:
        before, after: scrapes of one server around the traffic to measure.

    Returns:
        Δ ddtree:verify_committed_tokens_total ÷ Δ sglang:spec_verify_calls_total; on a server
        without that counter, (Δ sglang:generation_tokens_total − Δ sglang:num_requests_total) ÷
        Δ verify calls. No value when no verify call happened in between (a request answered by
        its prefill alone, or a non-speculative SGLang server), when the server restarted, or
        when the counters are missing.
    """
    calls = counter_delta(before, after, SPEC_VERIFY_CALLS)
    committed, source = _committed_by_verify(
        counter_delta(before, after, VERIFY_COMMITTED_TOKENS),
        counter_delta(before, after, GENERATION_TOKENS),
        counter_delta(before, after, NUM_REQUESTS),
    )
    if committed is None or not calls:
        return Acceptance()
    return Acceptance(committed / calls, source)


def accept_length_lifetime(metrics: Metrics) -> Acceptance:
    """Committed tokens per verify step over a server's lifetime, prefill excluded.

    From the counters (as `accept_length_delta`, with zero as the "before"); only a server that
    exposes neither ddtree:verify_committed_tokens_total nor the token and request counters
    falls back to its `sglang:spec_accept_length` gauge, taken as it is (SGLang's gauge covers
    its latest logging interval, not the lifetime).

    Args:
        metrics: one scrape of `/metrics`.

    Returns:
        the acceptance and its source; no value before the first verify call.
    """
    calls = metrics.total(SPEC_VERIFY_CALLS)
    committed, source = _committed_by_verify(
        metrics.total(VERIFY_COMMITTED_TOKENS), metrics.total(GENERATION_TOKENS), metrics.total(NUM_REQUESTS)
    )
    if committed is not None and calls is not None:
        return Acceptance(committed / calls, source) if calls else Acceptance()
    gauge = metrics.mean(SPEC_ACCEPT_LENGTH)
    return Acceptance(gauge, SOURCE_GAUGE) if gauge is not None else Acceptance()


def running_requests(metrics: Metrics) -> float | None:
    """Requests in flight (`sglang:num_running_reqs`), None when the server does not export it.

    SGLang writes the total under `priority=""` and, with priority scheduling on, one more series per
    priority (srt/observability/metrics_collector.py, `_log_gauge_queue_count`): only the totals are summed.
    """
    values = [s.value for s in metrics.samples if s.name == RUNNING_REQUESTS and not s.labels.get("priority")]
    return math.fsum(values) if values else None
