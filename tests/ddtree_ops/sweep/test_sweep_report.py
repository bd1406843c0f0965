"""The sweep's figures: per-configuration rows over hosts, the recommendation and its margin, the
verify-width mark, and the three report files."""

from __future__ import annotations

import json
import math

from json_schemas import validate

from ddtree_ops.sweep.plan import SweepConfig
from ddtree_ops.sweep.report import config_rows, host_bests, recommend, recommendation_line, width_mark, write_report_files

CONFIGS = [SweepConfig(8, 4), SweepConfig(15, 4), SweepConfig(15, 8)]
HOSTS = ["a", "b"]


def _cell(config: SweepConfig, host: str, speedups: list[float], *, lossless=True, status="ok", tps=10.0, steps=3.0):
    return {
        "config": config.key, "budget": config.budget, "topk": config.topk, "host": host, "status": status,
        "verify_width": config.verify_width, "started_at": "t", "error": None if status == "ok" else "boom",
        "tree_tps": tps, "baseline_tps": 5.0, "tokens_per_step": steps, "ttft_s": 0.1, "lossless": lossless,
        "speedup": math.prod(speedups) ** (1 / len(speedups)),
        "prompts": [{"prompt": f"p{i}", "speedup": s} for i, s in enumerate(speedups)],
    }  # fmt: skip


def _cells(**by_key):
    return {f"{c['config']}/{c['host']}": c for cells in by_key.values() for c in cells}


def test_rows_take_the_geomean_over_every_host_and_prompt_and_mark_the_width():
    cells = _cells(
        a=[_cell(CONFIGS[0], "a", [1.0, 4.0]), _cell(CONFIGS[0], "b", [2.0, 2.0], tps=30.0)],
        b=[_cell(CONFIGS[1], "a", [3.0]), _cell(CONFIGS[1], "b", [3.0])],
    )
    rows = config_rows(CONFIGS, HOSTS, cells, block_size=16)
    assert rows[0]["speedup"] == 2.0  # geomean(1, 4, 2, 2), not the mean of host geomeans' arithmetic
    assert rows[0]["tree_tps"] == 20.0 and rows[0]["complete"] and rows[0]["lossless"] is True
    assert [r["width_rule"] for r in rows] == ["< block", "= block", "= block"]
    assert rows[2]["hosts_ok"] == 0 and rows[2]["lossless"] is None and rows[2]["speedup"] is None
    assert (width_mark(31 + 1, 16), width_mark(16, None)) == ("> block", "?")


def test_the_recommendation_is_the_fastest_lossless_complete_configuration_with_its_margin():
    cells = _cells(
        a=[_cell(CONFIGS[0], "a", [2.0]), _cell(CONFIGS[0], "b", [2.0])],
        # Fastest, but one prompt differed on host b: never recommended.
        b=[_cell(CONFIGS[1], "a", [5.0]), _cell(CONFIGS[1], "b", [5.0], lossless=False)],
        c=[_cell(CONFIGS[2], "a", [2.5]), _cell(CONFIGS[2], "b", [2.5])],
    )
    rows = config_rows(CONFIGS, HOSTS, cells, 16)
    assert [r["lossless"] for r in rows] == [True, False, True]
    rec = recommend(rows)
    assert (rec["budget"], rec["topk"]) == (15, 8)
    assert rec["runner_up"]["config"] == "b8-k4" and rec["margin"] == 2.5 / 2.0 - 1
    assert "budget 15, topk 8" in recommendation_line(rec) and "+25.0% over the runner-up budget 8, topk 4" in recommendation_line(rec)
    # Host b's best excludes its lossy cell; host a's own best is the lossless-everywhere-but-b one.
    assert host_bests(CONFIGS, HOSTS, cells) == {
        "a": {"config": "b15-k4", "budget": 15, "topk": 4, "speedup": 5.0},
        "b": {"config": "b15-k8", "budget": 15, "topk": 8, "speedup": 2.5},
    }


def test_a_configuration_missing_on_one_host_is_not_recommended():
    cells = _cells(a=[_cell(CONFIGS[0], "a", [9.0]), _cell(CONFIGS[0], "b", [9.0], status="failed")],
                   b=[_cell(CONFIGS[1], "a", [1.5]), _cell(CONFIGS[1], "b", [1.5])])  # fmt: skip
    rows = config_rows(CONFIGS, HOSTS, cells, 16)
    assert [r["lossless"] for r in rows] == [None, True, None]  # one host missing proves nothing either way
    rec = recommend(rows)
    assert rec["config"] == "b15-k4" and rec["runner_up"] is None and rec["margin"] is None
    assert recommend(config_rows(CONFIGS, HOSTS, {}, 16)) is None


def test_the_three_files_are_written_and_the_json_matches_the_schema(tmp_path):
    cells = _cells(a=[_cell(c, h, [1.0 + i]) for i, c in enumerate(CONFIGS) for h in HOSTS])
    rows = config_rows(CONFIGS, HOSTS, cells, 16)
    settings = {"budgets": [8, 15], "topks": [4, 8], "tree": "tree", "baseline": "baseline", "hosts": HOSTS, "runs": 1,
                "max_tokens": 8, "block_size": 16, "prompts": [{"name": "p0", "messages": []}]}  # fmt: skip
    doc = {
        "ok": True, "started_at": "t", "settings": settings, "interrupted": False, "configs": rows,
        "recommendation": recommend(rows), "applied": None, "cells": list(cells.values()), "resumed_skipped": [],
        "hosts": [{"host": h, "original": {"budget": 15, "topk": 8, "release_id": "r"}, "final": None, "best": None} for h in HOSTS],
        "runs": [], "failures": [], "warnings": [],
    }  # fmt: skip
    files = write_report_files(doc, tmp_path)
    assert json.loads(files["json"].read_text())["recommendation"]["config"] == "b15-k8"
    md = files["markdown"].read_text()
    assert "| 15 | 8 | 16 (= block) | 3.00 | 10.0 | 3.00x |" in md and "**recommended: budget 15, topk 8" in md
    assert files["chart"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    validate({**doc, "command": "sweep", "files": {k: str(v) for k, v in files.items()}})
