import re
import threading

import prometheus_client
import pytest
from ddtree_engine.reference.engine import load_engine
from ddtree_engine.types import GenerationResult, SamplingParams, SpeculativeConfig, StepStats
from ddtree_engine.server.metrics import (
    ACCEPT_LENGTH_HELP,
    MetricsSnapshot,
    ServerMetrics,
    format_journal_line,
    metrics_registry,
    render_prometheus,
)
from prometheus_client.parser import text_string_to_metric_families

from ddtree_ops.service.metrics_text import parse_metrics


def _result(steps, prompt_tokens=5):
    # The first token comes from the prefill, then each verify step commits `committed` tokens.
    committed = sum(s.committed for s in steps)
    return GenerationResult(list(range(1 + committed)), prompt_tokens, "length", list(steps))


def _samples(text):
    """{sample name: value} as prometheus_client's own parser reads the text (one series per metric here)."""
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def test_journal_line_has_the_format_operators_grep_for():
    steps = [StepStats(tree_nodes=15, accepted_drafts=6, committed=7)] * 4
    assert format_journal_line(steps, budget=15) == (
        "DDTREE metrics: bs=1 budget=15 avg_actual_nodes=16.00 avg_accepted_drafts=6.00 "
        "avg_commit_len=7.00 avg_accepted_depth=6.00"
    )


def test_journal_line_averages_and_counts_the_root():
    steps = [StepStats(15, 0, 1), StepStats(7, 3, 4), StepStats(15, 5, 5)]
    line = format_journal_line(steps, budget=15)
    assert "avg_actual_nodes=13.33" in line  # (16 + 8 + 16) / 3
    assert "avg_accepted_drafts=2.67" in line
    assert "avg_commit_len=3.33" in line
    assert line.endswith("avg_accepted_depth=2.67")


def test_journal_line_needs_steps():
    with pytest.raises(ValueError, match="at least one verify step"):
        format_journal_line([], budget=15)


def test_record_writes_one_line_per_window_of_steps_across_requests():
    lines = []
    metrics = ServerMetrics(budget=7, log_interval=3, log_sink=lines.append)
    metrics.record(_result([StepStats(7, 1, 2), StepStats(7, 3, 4)]))
    assert lines == []
    metrics.record(_result([StepStats(7, 5, 6), StepStats(7, 0, 1)]))
    assert lines == [format_journal_line([StepStats(7, 1, 2), StepStats(7, 3, 4), StepStats(7, 5, 6)], 7)]


def test_counters_and_accept_length():
    metrics = ServerMetrics(budget=15, log_interval=1000, log_sink=lambda _l: None)
    assert metrics.snapshot().spec_accept_length == 0.0
    metrics.record(_result([StepStats(15, 3, 4), StepStats(15, 5, 6)], prompt_tokens=9))
    snap = metrics.snapshot()
    assert snap == MetricsSnapshot(
        prompt_tokens=9,
        generation_tokens=11,
        num_requests=1,
        spec_verify_calls=2,
        tree_nodes=30,
        accepted_drafts=8,
        verify_committed_tokens=10,
    )
    # 11 tokens generated = 1 from the prefill + 4 + 6 committed by the two verify steps.
    # Acceptance counts what the verify steps committed: (4 + 6) / 2 = 5.0, not 11 / 2 = 5.5.
    assert snap.spec_accept_length == 5.0


def test_prometheus_text_carries_every_metric_and_counters_only_grow():
    metrics = ServerMetrics(budget=15, log_interval=1000, log_sink=lambda _l: None)
    before = _samples(render_prometheus(metrics.snapshot(), "tiny"))
    metrics.record(_result([StepStats(15, 2, 3)], prompt_tokens=4))
    text = render_prometheus(metrics.snapshot(), "tiny")
    after = _samples(text)
    assert set(after) == {
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:num_requests_total",
        "sglang:spec_verify_calls_total",
        "ddtree:tree_nodes_total",
        "ddtree:accepted_drafts_total",
        "ddtree:verify_committed_tokens_total",
        "sglang:spec_accept_length",
    }
    assert after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"] == 4
    assert after["ddtree:verify_committed_tokens_total"] == 3  # the prefill's token is not a verify step's
    assert after["sglang:spec_verify_calls_total"] == 1
    assert after["sglang:spec_accept_length"] == 3.0
    assert re.search(r'^sglang:prompt_tokens_total\{model_name="tiny"\} 4\.0$', text, re.MULTILINE)
    assert "# TYPE sglang:spec_accept_length gauge" in text
    # The HELP text states the definition, so an operator reading /metrics knows what 3.0 means.
    help_line = next(line for line in text.splitlines() if line.startswith("# HELP sglang:spec_accept_length "))
    assert "committed tokens per verify step" in help_line.lower() and "prefill's token excluded" in help_line
    assert "# TYPE ddtree:tree_nodes_total counter" in text


# What the exposition must say, metric by metric: (sample name, type, HELP), in order. The names and
# HELP texts are the contract with healthcheck/compare and with operators' dashboards.
EXPECTED_FAMILIES = [
    ("sglang:prompt_tokens_total", "counter", "Prompt tokens processed."),
    ("sglang:generation_tokens_total", "counter", "Tokens generated (prefill token included)."),
    ("sglang:num_requests_total", "counter", "Generation requests finished."),
    ("sglang:spec_verify_calls_total", "counter", "Target verify forwards (one per step)."),
    ("ddtree:tree_nodes_total", "counter", "Drafted nodes verified, roots excluded."),
    ("ddtree:accepted_drafts_total", "counter", "Drafted tokens the target accepted."),
    (
        "ddtree:verify_committed_tokens_total",
        "counter",
        "Tokens committed by verify steps (accepted drafts + one bonus token each); the prefill's token excluded.",
    ),
    ("sglang:spec_accept_length", "gauge", ACCEPT_LENGTH_HELP),
]


def test_prometheus_clients_parser_reads_every_family_with_its_type_help_and_value():
    snap = MetricsSnapshot(40, 120, 6, 30, 450, 84, 114)
    families = list(text_string_to_metric_families(render_prometheus(snap, "lab")))
    got = [(f.samples[0].name, f.type, f.documentation) for f in families]
    assert got == EXPECTED_FAMILIES
    assert all(len(f.samples) == 1 and f.samples[0].labels == {"model_name": "lab"} for f in families)
    values = [f.samples[0].value for f in families]
    assert values == [40.0, 120.0, 6.0, 30.0, 450.0, 84.0, 114.0, 114 / 30]
    # No `*_created` series: SGLang's (multiprocess) exposition has none, and neither has this one.
    assert not [f for f in families if f.samples[0].name.endswith("_created")]


@pytest.mark.parametrize(
    "model_name",
    ['say "hi"', "back\\slash\\", "two\nlines", 'all "three" \\ at\nonce\\', "Qwen/Qwen3.5-27B"],
)
def test_label_values_round_trip_through_the_escaping(model_name):
    text = render_prometheus(MetricsSnapshot(generation_tokens=3), model_name)
    assert len(text.splitlines()) == 3 * len(EXPECTED_FAMILIES), "a newline in a label stays escaped on its line"
    for family in text_string_to_metric_families(text):
        assert family.samples[0].labels == {"model_name": model_name}
    # ... and the control side's reader (ddtree_ops.service.metrics_text) agrees with prometheus_client's.
    m = parse_metrics(text)
    assert {s.labels["model_name"] for s in m.samples} == {model_name}
    assert m.total("sglang:generation_tokens_total") == 3.0


def test_each_registry_reads_its_own_metrics_and_the_global_one_stays_empty():
    a = ServerMetrics(budget=15, log_interval=1000, log_sink=lambda _l: None)
    b = ServerMetrics(budget=15, log_interval=1000, log_sink=lambda _l: None)
    registry_a, registry_b = metrics_registry(a.snapshot, "a"), metrics_registry(b.snapshot, "b")
    a.record(_result([StepStats(15, 2, 3)]))
    # Values come from the snapshot at scrape time, not from when the registry was made.
    assert _samples(prometheus_client.generate_latest(registry_a).decode())["sglang:generation_tokens_total"] == 4
    assert _samples(prometheus_client.generate_latest(registry_b).decode())["sglang:generation_tokens_total"] == 0
    global_text = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "sglang:" not in global_text and "ddtree:" not in global_text


def test_concurrent_records_lose_nothing():
    lines = []
    metrics = ServerMetrics(budget=3, log_interval=10, log_sink=lines.append)
    result = _result([StepStats(3, 1, 2)] * 5)

    def hammer():
        for _ in range(200):
            metrics.record(result)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = metrics.snapshot()
    assert snap.num_requests == 800
    assert snap.spec_verify_calls == 4000
    assert snap.generation_tokens == 800 * 11
    assert snap.verify_committed_tokens == 800 * 10
    assert snap.spec_accept_length == 2.0
    assert len(lines) == 400


def test_log_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval"):
        ServerMetrics(budget=1, log_interval=0)


# ---- acceptance from a real engine's own step records ------------------------------------------


@pytest.fixture(scope="module")
def ar_engine(qwen3_pair):
    target, draft = qwen3_pair
    return load_engine(str(target), str(draft), SpeculativeConfig("ar"), device="cpu", dtype="float32")


def _served(engine, max_new_tokens):
    """Run one request through ServerMetrics; returns (result, snapshot, journal lines)."""
    lines = []
    metrics = ServerMetrics(budget=15, log_interval=1, log_sink=lines.append)
    prompt = list(engine.tokenizer.encode("The quick brown fox", add_special_tokens=False))
    result = engine.generate(prompt, SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0))
    metrics.record(result)
    return result, metrics.snapshot(), lines


def test_an_ar_service_reads_exactly_one(ar_engine):
    # ar commits one token per verify step; the prefill's token is not a step's.
    result, snap, lines = _served(ar_engine, 12)
    assert len(result.token_ids) == 12 and result.verify_steps == 11
    assert snap.spec_accept_length == 1.0
    assert snap.verify_committed_tokens == snap.spec_verify_calls == 11
    assert all("avg_commit_len=1.00" in line for line in lines) and len(lines) == 11
    assert _samples(render_prometheus(snap, "ar"))["sglang:spec_accept_length"] == 1.0


def test_a_three_token_answer_reads_one_not_one_and_a_half(ar_engine):
    # 3 tokens = the prefill's + 2 verify steps of 1: acceptance 2 / 2 = 1.0 (3 / 2 would be 1.5).
    result, snap, _lines = _served(ar_engine, 3)
    assert len(result.token_ids) == 3 and result.verify_steps == 2
    assert snap.spec_accept_length == 1.0


def test_a_tree_service_reads_its_committed_tokens_per_step(qwen3_pair):
    target, draft = qwen3_pair
    engine = load_engine(str(target), str(draft), SpeculativeConfig("ddtree", 15, 8), device="cpu", dtype="float32")
    result, snap, lines = _served(engine, 24)
    committed = [s.committed for s in result.steps]
    # Independently of the counters: the engine's own step records, and the token count minus the prefill's.
    assert sum(committed) == len(result.token_ids) - 1
    assert snap.spec_accept_length == pytest.approx(sum(committed) / len(committed))
    assert [float(line.split("avg_commit_len=")[1].split()[0]) for line in lines] == committed
