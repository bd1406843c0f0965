import re
import threading

import pytest
from ddtree_engine.types import GenerationResult, StepStats
from ddtree_engine.server.metrics import (
    MetricsSnapshot,
    ServerMetrics,
    format_journal_line,
    render_prometheus,
)


def _result(steps, prompt_tokens=5):
    committed = sum(s.committed for s in steps)
    return GenerationResult(list(range(1 + committed)), prompt_tokens, "length", list(steps))


def _samples(text):
    """{metric name: value} from Prometheus text (labels dropped)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_and_labels, value = line.rsplit(" ", 1)
            out[name_and_labels.split("{", 1)[0]] = float(value)
    return out


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
        prompt_tokens=9, generation_tokens=11, num_requests=1, spec_verify_calls=2, tree_nodes=30, accepted_drafts=8
    )
    assert snap.spec_accept_length == pytest.approx(5.5)


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
        "sglang:spec_accept_length",
    }
    assert after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"] == 4
    assert after["sglang:spec_verify_calls_total"] == 1
    assert after["sglang:spec_accept_length"] == 4.0
    assert re.search(r'^sglang:prompt_tokens_total\{model_name="tiny"\} 4\.0$', text, re.MULTILINE)
    assert "# TYPE sglang:spec_accept_length gauge" in text
    assert "# TYPE ddtree:tree_nodes_total counter" in text


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
    assert len(lines) == 400


def test_log_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval"):
        ServerMetrics(budget=1, log_interval=0)
