import math

import pytest

from ddtree_ops.metrics_text import (
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
