"""Reading Prometheus text exposition (what `/metrics` returns on both engine backends).

Only the parts the tools need: samples with labels and values; `# HELP`/`# TYPE` lines and
timestamps are skipped. SGLang labels every series (`model_name=…`), so values are read by
metric name with the label sets summed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

# Metric names the tools read (SGLang's names; the reference server uses the same ones).
GENERATION_TOKENS = "sglang:generation_tokens_total"
PROMPT_TOKENS = "sglang:prompt_tokens_total"
NUM_REQUESTS = "sglang:num_requests_total"
SPEC_VERIFY_CALLS = "sglang:spec_verify_calls_total"
SPEC_ACCEPT_LENGTH = "sglang:spec_accept_length"
# The DDTree engine's own counter of tokens committed by verify steps (SGLang has no such counter).
VERIFY_COMMITTED_TOKENS = "ddtree:verify_committed_tokens_total"

# The one definition of acceptance every tool shows (tables, JSON, Markdown).
ACCEPT_DEFINITION = "accept = committed tokens per verify step, prefill excluded"
# Where a figure came from (`Acceptance.source`).
SOURCE_COMMITTED = "verify_committed_tokens"  # ddtree:verify_committed_tokens_total / verify calls
SOURCE_TOKENS_MINUS_REQUESTS = "generation_minus_requests"  # (generation tokens - requests) / verify calls
SOURCE_GAUGE = "spec_accept_length_gauge"  # the server's own gauge, taken as it is

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^(?P<name>{_NAME})(?:\{{(?P<labels>.*)\}})?\s+(?P<value>\S+)(?:\s+(?P<ts>-?\d+))?\s*$")
_LABEL = re.compile(r'\s*(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"(?P<value>(?:[^"\\]|\\.)*)"\s*,?')


class MetricsParseError(ValueError):
    """A line of the exposition is not a sample, a comment or blank."""


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


def _unescape(value: str) -> str:
    return value.replace(r"\\", "\0").replace(r"\"", '"').replace(r"\n", "\n").replace("\0", "\\")


def _parse_labels(text: str, line_no: int) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m or m.end() == pos:
            raise MetricsParseError(f"line {line_no}: malformed labels {{{text}}}")
        labels[m.group("key")] = _unescape(m.group("value"))
        pos = m.end()
    return labels


def _parse_value(text: str, line_no: int) -> float:
    special = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
    if text in special:
        return special[text]
    try:
        return float(text)
    except ValueError:
        raise MetricsParseError(f"line {line_no}: value {text!r} is not a number") from None


def parse_metrics(text: str) -> Metrics:
    """Parse Prometheus text format (0.0.4).

    Args:
        text: the body of a `/metrics` response.

    Returns:
        every sample in order of appearance.

    Raises:
        MetricsParseError: naming the first line that is neither a comment, blank nor a sample.
    """
    samples: list[Sample] = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise MetricsParseError(f"line {line_no}: not a Prometheus sample: {raw!r}")
        labels = _parse_labels(m.group("labels"), line_no) if m.group("labels") else {}
        samples.append(Sample(m.group("name"), labels, _parse_value(m.group("value"), line_no)))
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
