import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ddtree_ops.service.metrics_text import (
    GENERATION_TOKENS,
    NUM_REQUESTS,
    SOURCE_COMMITTED,
    SOURCE_GAUGE,
    SOURCE_TOKENS_MINUS_REQUESTS,
    SPEC_ACCEPT_LENGTH,
    SPEC_VERIFY_CALLS,
    VERIFY_COMMITTED_TOKENS,
    Acceptance,
    MetricsParseError,
    accept_length_delta,
    accept_length_lifetime,
    counter_delta,
    parse_metrics,
)

# What the reference server renders (ddtree_engine.server.metrics.render_prometheus).
ENGINE_TEXT = """\
# HELP sglang:prompt_tokens_total Prompt tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="lab"} 40.0
# HELP sglang:generation_tokens_total Tokens generated (prefill token included).
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="lab"} 120.0
sglang:num_requests_total{model_name="lab"} 6.0
sglang:spec_verify_calls_total{model_name="lab"} 30.0
ddtree:verify_committed_tokens_total{model_name="lab"} 114.0
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="lab"} 3.8
"""


def test_reads_engine_exposition():
    m = parse_metrics(ENGINE_TEXT)
    assert m.total(GENERATION_TOKENS) == 120.0
    assert m.total(SPEC_VERIFY_CALLS) == 30.0
    assert m.mean(SPEC_ACCEPT_LENGTH) == 3.8
    assert m.total(VERIFY_COMMITTED_TOKENS) == 114.0
    assert m.samples[0].labels == {"model_name": "lab"}
    assert m.total("sglang:missing") is None


def test_counters_sum_over_label_sets_and_labels_unescape():
    text = (
        'sglang:generation_tokens_total{model_name="a",tp_rank="0"} 10\n'
        'sglang:generation_tokens_total{model_name="b \\"q\\" \\\\ x",tp_rank="1"} 5.5 1700000000000\n'
        "plain_metric 3e2\n"
        "nan_metric NaN\n"
        "inf_metric{} +Inf\n"
    )
    m = parse_metrics(text)
    assert m.total(GENERATION_TOKENS) == 15.5
    assert m.samples[1].labels["model_name"] == 'b "q" \\ x'
    assert m.total("plain_metric") == 300.0
    assert math.isnan(m.total("nan_metric"))
    assert m.total("inf_metric") == math.inf


def test_gauges_average_over_series():
    m = parse_metrics('g{rank="0"} 1\ng{rank="1"} 2\n')
    assert m.mean("g") == 1.5 and m.total("g") == 3.0
    assert m.mean("absent") is None


@pytest.mark.parametrize(
    "bad, line_no",
    [
        ("sglang:x{model_name=lab} 1", 1),  # label value not quoted
        ("ok 1\nsglang:x notanumber", 2),
        ("ok 1\n\n{broken", 3),
        ('ok 1\nsglang:x{a="1",a="2"} 1', 2),  # one label twice
        ("ok 1\n# TYPE sglang:x\n", 2),  # TYPE without a type
    ],
)
def test_malformed_lines_are_named(bad, line_no):
    raw = bad.splitlines()[line_no - 1]
    with pytest.raises(MetricsParseError, match=rf"^line {line_no}: .+: {re.escape(repr(raw))}$"):
        parse_metrics(bad)


def _snap(tokens, calls, requests=None, committed=None, gauge=None):
    """A scrape with the counters given (None: the server does not expose that one)."""
    lines = [f"{GENERATION_TOKENS} {tokens}", f"{SPEC_VERIFY_CALLS} {calls}"]
    if requests is not None:
        lines.append(f"{NUM_REQUESTS} {requests}")
    if committed is not None:
        lines.append(f"{VERIFY_COMMITTED_TOKENS} {committed}")
    if gauge is not None:
        lines.append(f"{SPEC_ACCEPT_LENGTH} {gauge}")
    return parse_metrics("\n".join(lines) + "\n")


def test_accept_length_is_a_delta_of_committed_tokens_not_the_lifetime_ratio():
    # One 65-token request: 1 token from its prefill, 64 committed by 16 verify steps.
    before = _snap(1000, 900, requests=40, committed=960)
    after = _snap(1065, 916, requests=41, committed=1024)
    assert accept_length_delta(before, after) == Acceptance(64 / 16, SOURCE_COMMITTED)
    assert counter_delta(before, after, GENERATION_TOKENS) == 65


def test_an_ar_request_reads_exactly_one():
    # ar: 12 tokens = the prefill's + 11 verify steps of one token each.
    assert accept_length_delta(_snap(0, 0, 0, 0), _snap(12, 11, 1, 11)).value == 1.0
    assert accept_length_delta(_snap(0, 0, 0), _snap(12, 11, 1)).value == 1.0  # the fallback agrees


def test_a_three_token_answer_reads_one_not_one_and_a_half():
    # 3 tokens from the prefill + 2 one-token verify steps: 2 / 2, where tokens / steps said 3 / 2.
    assert accept_length_delta(_snap(10, 5, 2, 8), _snap(13, 7, 3, 10)).value == 1.0
    assert accept_length_delta(_snap(10, 5, 2), _snap(13, 7, 3)).value == 1.0


def test_without_the_committed_counter_the_prefill_tokens_are_subtracted():
    # SGLang's own servers: no ddtree counter; each finished request's first token is its prefill's.
    # Two requests, 40 tokens, 9 verify steps: (40 - 2) / 9.
    got = accept_length_delta(_snap(100, 50, 10), _snap(140, 59, 12))
    assert got == Acceptance(38 / 9, SOURCE_TOKENS_MINUS_REQUESTS)
    # The committed counter wins over the fallback when the server has it.
    assert accept_length_delta(_snap(100, 50, 10, 90), _snap(140, 59, 12, 125)) == Acceptance(35 / 9, SOURCE_COMMITTED)


def test_accept_length_none_without_verify_calls_or_after_restart():
    assert accept_length_delta(_snap(10, 5, 1, 4), _snap(11, 5, 2, 4)) == Acceptance()  # answered by the prefill alone
    assert accept_length_delta(_snap(100, 50, 5, 95), _snap(8, 2, 1, 7)) == Acceptance()  # counters reset: restarted
    assert accept_length_delta(_snap(10, 5), _snap(20, 7)) == Acceptance()  # no request counter: cannot subtract
    assert accept_length_delta(parse_metrics("x 1\n"), _snap(8, 2, 1, 7)) == Acceptance()


def test_lifetime_acceptance_from_counters_then_the_gauge():
    assert accept_length_lifetime(parse_metrics(ENGINE_TEXT)) == Acceptance(114 / 30, SOURCE_COMMITTED)
    # A server without the ddtree counter, whose own gauge overstates (it counted the prefill tokens):
    # the counters still give the definition, not the gauge's 120 / 30.
    assert accept_length_lifetime(_snap(120, 30, 6, gauge=4.0)) == Acceptance(114 / 30, SOURCE_TOKENS_MINUS_REQUESTS)
    assert accept_length_lifetime(parse_metrics(f"{SPEC_ACCEPT_LENGTH} 2.5\n")) == Acceptance(2.5, SOURCE_GAUGE)
    assert accept_length_lifetime(_snap(3, 0, 3, 0)) == Acceptance()  # no verify step yet
    assert accept_length_lifetime(parse_metrics("x 1\n")) == Acceptance()


# ---- SGLang's own exposition ---------------------------------------------------------------
# SGLang declares its metrics with prometheus_client (sglang/srt/metrics/collector.py): counters
# named with `_total` and labelled by model and (newer releases) streaming, per-rank gauges
# (multiprocess_mode="mostrecent"), histograms. Its /metrics is prometheus_client's ASGI app over
# a MultiProcessCollector. These tests write such an exposition with the same library calls.

MODEL = 'Qwen/Qwen3.5-27B "tree" \\ draft\nv2'  # a quote, a backslash and a newline to escape


def _record_sglang_traffic(registry=None, ranks=(0, 1), tokenizer=True):
    """Two finished requests as SGLang's tokenizer manager counts them, per-rank gauges as its schedulers set them.

    Streaming: 40 tokens, 13 verify steps. Not streaming: 25 tokens, 8 steps. So (65 - 2) / 21 = 3.0.
    Returns the tokenizer's counters by name (empty without `tokenizer`).
    """
    kw = {} if registry is None else {"registry": registry}
    counters = {}
    if tokenizer:
        labels = ["model_name", "is_streaming"]
        prompt = Counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", labels, **kw)
        generated = Counter("sglang:generation_tokens_total", "Number of generation tokens processed.", labels, **kw)
        requests = Counter("sglang:num_requests_total", "Number of requests processed.", labels, **kw)
        verify = Counter("sglang:spec_verify_calls_total", "Number of speculative verify calls.", labels, **kw)
        ttft = Histogram(
            "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels,
            buckets=[0.1, 0.2, 0.4, 0.6, 0.8, 1, 2], **kw,
        )  # fmt: skip
        for streaming, tokens, steps, first in (("true", 40, 13, 0.15), ("false", 25, 8, 0.3)):
            prompt.labels(MODEL, streaming).inc(11)
            generated.labels(MODEL, streaming).inc(tokens)
            requests.labels(MODEL, streaming).inc()
            verify.labels(MODEL, streaming).inc(steps)
            ttft.labels(MODEL, streaming).observe(first)
        counters = {GENERATION_TOKENS: generated, NUM_REQUESTS: requests, SPEC_VERIFY_CALLS: verify}
    gauge = Gauge(
        "sglang:spec_accept_length", "The average acceptance length of speculative decoding.",
        ["model_name", "tp_rank"], multiprocess_mode="mostrecent", **kw,
    )  # fmt: skip
    for rank in ranks:
        gauge.labels(MODEL, str(rank)).set(2.9 + 0.2 * rank)
    return counters


def _assert_reads_sglang_traffic(m):
    assert m.total(GENERATION_TOKENS) == 65.0 and m.total(NUM_REQUESTS) == 2.0 and m.total(SPEC_VERIFY_CALLS) == 21.0
    assert {s.labels["is_streaming"] for s in m.samples if s.name == GENERATION_TOKENS} == {"true", "false"}
    assert all(s.labels["model_name"] == MODEL for s in m.samples), "escaped label values come back as written"
    assert m.mean(SPEC_ACCEPT_LENGTH) == pytest.approx(3.0)
    assert m.total("sglang:time_to_first_token_seconds_count") == 2.0
    buckets = {
        (s.labels["is_streaming"], s.labels["le"]): s.value
        for s in m.samples
        if s.name == "sglang:time_to_first_token_seconds_bucket"
    }  # cumulative: the streaming request's first token came at 0.15 s, the other's at 0.3 s
    assert [buckets["true", le] for le in ("0.1", "0.2", "0.4", "+Inf")] == [0.0, 1.0, 1.0, 1.0]
    assert [buckets["false", le] for le in ("0.1", "0.2", "0.4", "+Inf")] == [0.0, 0.0, 1.0, 1.0]
    assert accept_length_lifetime(m) == Acceptance(63 / 21, SOURCE_TOKENS_MINUS_REQUESTS)


def test_reads_an_sglang_exposition_with_created_series():
    registry = CollectorRegistry()
    _record_sglang_traffic(registry)
    text = generate_latest(registry).decode()
    assert "# TYPE sglang:generation_tokens_total counter" in text and "\\n" in text and '\\"tree\\"' in text
    m = parse_metrics(text)
    _assert_reads_sglang_traffic(m)
    # Outside multiprocess mode every counter also writes `<name>_created` (a Unix time, ~1.7e9):
    # its own series, never part of the counter's total.
    created = [s for s in m.samples if s.name == "sglang:generation_tokens_created"]
    assert len(created) == 2 and all(s.value > 1e9 for s in created)


def test_an_sglang_delta_counts_only_the_traffic_between_scrapes():
    registry = CollectorRegistry()
    counters = _record_sglang_traffic(registry)
    before = parse_metrics(generate_latest(registry).decode())
    # One more streaming request: 9 tokens, 4 verify steps, so (9 - 1) / 4 = 2.0.
    for name, value in ((GENERATION_TOKENS, 9), (NUM_REQUESTS, 1), (SPEC_VERIFY_CALLS, 4)):
        counters[name].labels(MODEL, "true").inc(value)
    after = parse_metrics(generate_latest(registry).decode())
    assert accept_length_delta(before, after) == Acceptance(2.0, SOURCE_TOKENS_MINUS_REQUESTS)


_MULTIPROCESS_WRITER = """
import sys
sys.path.insert(0, sys.argv[1])
from test_metrics_text import _record_sglang_traffic
role = sys.argv[2]
_record_sglang_traffic(ranks=() if role == "tokenizer" else (int(role),), tokenizer=role == "tokenizer")
"""
_MULTIPROCESS_READER = """
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
registry = CollectorRegistry()
multiprocess.MultiProcessCollector(registry)
print(generate_latest(registry).decode(), end="")
"""


def test_reads_sglangs_multiprocess_exposition(tmp_path):
    # As SGLang serves it: the tokenizer manager and one scheduler per rank write their metrics
    # from their own processes into PROMETHEUS_MULTIPROC_DIR; /metrics merges them. No _created.
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    here = str(Path(__file__).parent)
    for role in ("tokenizer", "0", "1"):
        subprocess.run([sys.executable, "-c", _MULTIPROCESS_WRITER, here, role], env=env, check=True, timeout=60)
    text = subprocess.run(
        [sys.executable, "-c", _MULTIPROCESS_READER], env=env, check=True, capture_output=True, text=True, timeout=60
    ).stdout
    m = parse_metrics(text)
    _assert_reads_sglang_traffic(m)
    assert not [name for name in m.names() if name.endswith("_created")]


def test_a_counter_typed_without_total_is_read_under_its_total_name():
    # prometheus_client names every counter sample `<family>_total`; the names the tools read all end so.
    m = parse_metrics("# TYPE sglang:old_style counter\nsglang:old_style 3\n")
    assert m.names() == {"sglang:old_style_total"} and m.total("sglang:old_style_total") == 3.0
