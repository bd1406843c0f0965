import math

import pytest

from ddtree_ops.service.metrics_text import (
    GENERATION_TOKENS,
    SPEC_ACCEPT_LENGTH,
    SPEC_VERIFY_CALLS,
    MetricsParseError,
    accept_length_delta,
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
sglang:spec_verify_calls_total{model_name="lab"} 30.0
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="lab"} 4.0
"""


def test_reads_engine_exposition():
    m = parse_metrics(ENGINE_TEXT)
    assert m.total(GENERATION_TOKENS) == 120.0
    assert m.total(SPEC_VERIFY_CALLS) == 30.0
    assert m.mean(SPEC_ACCEPT_LENGTH) == 4.0
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
    "bad, where",
    [
        ("sglang:x{model_name=lab} 1", "line 1: malformed labels"),
        ("ok 1\nsglang:x notanumber", "line 2: value 'notanumber'"),
        ("ok 1\n\n{broken", "line 3: not a Prometheus sample"),
    ],
)
def test_malformed_lines_are_named(bad, where):
    with pytest.raises(MetricsParseError, match=where):
        parse_metrics(bad)


def _snap(tokens, calls):
    return parse_metrics(f"{GENERATION_TOKENS} {tokens}\n{SPEC_VERIFY_CALLS} {calls}\n")


def test_accept_length_is_a_delta_not_the_lifetime_ratio():
    before, after = _snap(1000, 900), _snap(1064, 916)
    assert accept_length_delta(before, after) == 64 / 16
    assert counter_delta(before, after, GENERATION_TOKENS) == 64


def test_accept_length_none_without_verify_calls_or_after_restart():
    assert accept_length_delta(_snap(10, 5), _snap(20, 5)) is None  # an `ar` service
    assert accept_length_delta(_snap(100, 50), _snap(8, 2)) is None  # counters reset: server restarted
    assert accept_length_delta(parse_metrics("x 1\n"), _snap(8, 2)) is None
