import json
import math
from dataclasses import dataclass

import pytest

from ddtree_ops.compare.report import (
    TABLE_COLUMNS,
    arm_stats,
    decode_tokens_per_s,
    geomean,
    lossless_check,
    median,
    relative_delta,
    render_markdown,
    speedup,
    summarize_prompt,
    table_rows,
    totals,
    write_report_files,
)


@dataclass
class Run:
    decode_tps: float | None = None
    ttft_s: float | None = None
    accept_length: float | None = None
    completion_tokens: int | None = None
    token_ids: list[int] | None = None
    text: str = ""
    error: str | None = None


def test_geomean_of_ratios():
    assert geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert geomean([1.5, 1.5, None]) == pytest.approx(1.5)
    assert geomean([1.0, 8.0]) == pytest.approx(math.sqrt(8.0))
    assert geomean([]) is None
    assert geomean([None]) is None
    with pytest.raises(ValueError, match="positive"):
        geomean([1.0, 0.0])


def test_median_and_deltas():
    assert median([3.0, None, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0]) == 2.5
    assert median([None]) is None
    assert speedup(100.0, 150.0) == 1.5
    assert speedup(None, 1.0) is None
    assert speedup(0.0, 1.0) is None
    assert relative_delta(4.0, 5.0) == pytest.approx(0.25)
    assert relative_delta(0.0, 5.0) is None


def test_decode_tokens_per_s_excludes_the_prefill_token():
    # 11 tokens: the first arrives at t=1.0, the last at t=3.0 → 10 decoded tokens in 2 s.
    assert decode_tokens_per_s(11, 1.0, 3.0) == 5.0
    assert decode_tokens_per_s(1, 1.0, 3.0) is None
    assert decode_tokens_per_s(5, 2.0, 2.0) is None  # everything in one chunk: no span to divide by
    assert decode_tokens_per_s(None, 1.0, 2.0) is None


def test_arm_stats_counts_errors_and_takes_medians_of_successes():
    runs = [Run(10.0, 0.1, 2.0, 20), Run(30.0, 0.3, 4.0, 20), Run(20.0, 0.2, 3.0, 20), Run(error="boom", decode_tps=999.0)]
    s = arm_stats(runs)
    assert (s.runs, s.errors) == (4, 1)
    assert s.decode_tps == 20.0 and s.ttft_s == 0.2 and s.accept_length == 3.0 and s.completion_tokens == 20


def test_lossless_check_names_first_difference():
    ok = lossless_check([(1, 2, 3)], [(1, 2, 3), (1, 2, 3)], "token")
    assert ok.ok and "3 runs identical" in ok.detail
    bad = lossless_check([(1, 2, 3), (1, 2, 3)], [(1, 2, 3), (1, 9, 3)], "token")
    assert not bad.ok
    assert bad.detail == "tree run 1 differs from baseline run 0 at token 1 (lengths 3 vs 3)"
    shorter = lossless_check(["abc"], ["ab"], "character")
    assert not shorter.ok and "at character 2" in shorter.detail
    # Runs of the baseline must agree with each other too (T=0 must be deterministic).
    assert not lossless_check([(1,), (2,)], [(1,)], "token").ok
    assert not lossless_check([], [(1,)], "token").ok


def test_summarize_prompt_prefers_token_ids_and_falls_back_to_text():
    b = [Run(10.0, 0.1, 1.0, 5, [1, 2, 3], "x")]
    t = [Run(15.0, 0.1, 3.0, 5, [1, 2, 3], "y")]
    s = summarize_prompt("h1", "code", b, t)
    # Same ids, different text: ids decide (text may be cut differently by detokenization).
    assert s.lossless.ok and "token" in s.lossless.detail
    assert s.speedup == 1.5
    assert s.accept_length_delta == pytest.approx(2.0)
    no_ids = summarize_prompt("h1", "code", [Run(10.0, text="abc")], [Run(10.0, text="abd")])
    assert not no_ids.lossless.ok and "character 2" in no_ids.lossless.detail


def test_totals_geomean_per_host_and_overall():
    def summ(host, b, t):
        return summarize_prompt(host, "p", [Run(b, token_ids=[1])], [Run(t, token_ids=[1])])

    tot = totals([summ("a", 10, 20), summ("a", 10, 5), summ("b", 10, 40)])
    assert tot.host_speedup["a"] == pytest.approx(1.0)
    assert tot.host_speedup["b"] == pytest.approx(4.0)
    assert tot.overall_speedup == pytest.approx((2.0 * 0.5 * 4.0) ** (1 / 3))


def _doc():
    return {
        "started_at": "2026-01-01T00:00:00+00:00",
        "settings": {"baseline": "baseline", "tree": "tree", "runs": 2, "max_tokens": 32},
        "failures": [],
    }


def test_table_and_markdown():
    good = summarize_prompt("h1", "code", [Run(10.0, 0.05, 2.0, 9, [1])], [Run(25.0, 0.06, 5.0, 9, [1])])
    bad = summarize_prompt("h1", "json", [Run(10.0, token_ids=[1])], [Run(10.0, token_ids=[2])])
    rows = table_rows([good, bad])
    assert len(rows[0]) == len(TABLE_COLUMNS)
    assert rows[0] == ["h1", "code", "10.0", "25.0", "2.50x", "2.00", "5.00", "50 ms", "60 ms", "✓"]
    assert rows[1][-1] == "✗"
    md = render_markdown(_doc(), [good, bad], totals([good, bad]))
    assert "| h1 | code | 10.0 | 25.0 | 2.50x |" in md
    assert "**overall: 1.58x**" in md
    assert "h1 / json: tree run 0 differs" in md
    # The report says which acceptance its accept columns hold, right under the table.
    table_end = md.index("| h1 | json |")
    footnote = md[table_end:].split("\n")[2]
    assert footnote.startswith("accept = committed tokens per verify step, prefill excluded")


def test_write_report_files(tmp_path):
    s = summarize_prompt("h1", "code", [Run(10.0, token_ids=[1])], [Run(20.0, token_ids=[1])])
    paths = write_report_files(_doc(), [s], totals([s]), tmp_path / "out")
    assert json.loads(paths["json"].read_text())["settings"]["runs"] == 2
    assert "2.00x" in paths["markdown"].read_text()
    assert paths["chart"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
