"""benchmarks/sglang_h200/profile_compare.py on small hand-made traces: the per-step call trees of two
arms line up through the workers' own frames, the first run_batch (a prefill) is left out, and the
same-code ratio compares functions both arms call equally often. The real traces come from the H200."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "benchmarks/sglang_h200/profile_compare.py"
SCHED = "/x/site-packages/sglang/srt/managers/scheduler.py(4613): run_batch"
SHARED = "/x/site-packages/sglang/srt/model_executor/model_runner.py(1813): forward"
SLOW = "/x/site-packages/sglang/srt/utils/common.py(608): async_d2h"


def py(name, ts, dur):
    return {"ph": "X", "cat": "python_function", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def write_trace(folder: Path, worker: str, extra: list[str], shared_us: float, steps: int = 30) -> Path:
    events = []
    for i in range(steps + 1):  # the first is the prefill
        t = i * 1000.0
        wrappers = [worker] + extra
        dur = 900.0 if i else 5000.0
        events.append(py(SCHED, t, dur))
        for depth, name in enumerate(wrappers):
            events.append(py(name, t + 1 + depth, dur - 2 - 2 * depth))
        inner = t + 1 + len(wrappers)
        events.append(py(SHARED, inner, shared_us))
        events.append(py(SLOW, inner + shared_us + 1, shared_us / 4))
    folder.mkdir(parents=True)
    with gzip.open(folder / "a.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    return folder


def test_the_two_workers_trees_line_up_and_the_same_code_ratio_is_printed(tmp_path):
    base = write_trace(tmp_path / "dflash", "/x/site-packages/sglang/srt/speculative/dflash_worker_v2.py(2336): forward_batch_generation", [], 400.0)
    other = write_trace(tmp_path / "ddtree", "/w/src/ddtree_engine/sglang_plugin/worker.py(269): forward_batch_generation",
                        ["/w/src/ddtree_engine/sglang_plugin/worker.py(405): _tree_decode"], 600.0)
    out = subprocess.run([sys.executable, str(SCRIPT), str(base), str(other), "10"], capture_output=True, text=True, check=True).stdout
    assert "decode steps: 30 and 30; run_batch 900 and 900 us/step" in out  # the prefill's 5000 us left out
    # The shared SGLang call sits under one worker-step name in both trees, _tree_decode left out.
    assert "| 400 | 600 | +200 | . . model_executor/model_runner.py(1813): forward |" in out
    assert "_tree_decode" not in out
    assert "same code, other/base over 2 functions: median 1.50" in out  # shared and async_d2h, not run_batch


def test_a_trace_without_python_stacks_is_named(tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    with gzip.open(folder / "a.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 1}]}, f)
    run = subprocess.run([sys.executable, str(SCRIPT), str(folder), str(folder)], capture_output=True, text=True)
    assert run.returncode != 0 and "PROFILE_STACK=1" in run.stderr


SUMMARY = REPO / "benchmarks/sglang_h200/profile_summary.py"


def kernel(name, ts, dur):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}


def test_profile_summary_reads_a_gzip_trace_and_a_bare_list_alike(tmp_path):
    """profile_summary.py reads traces with profile_compare.read_trace: a gzip'd dict and a plain .json list."""
    events = [kernel("gemm", 0, 30), kernel("norm", 40, 10), kernel("gemm", 100, 30)]
    (tmp_path / "gz").mkdir()
    with gzip.open(tmp_path / "gz" / "x.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "y.json").write_text(json.dumps(events))
    for folder, name in (("gz", "x.trace.json.gz"), ("plain", "y.json")):
        out = subprocess.run([sys.executable, str(SUMMARY), str(tmp_path / folder), "2"], capture_output=True, text=True, check=True).stdout
        assert f"trace {name}: 3 GPU ops over 2 steps; GPU busy 35.0 us/step, span 65.0 us/step" in out
        assert "| 30.0 | 1.0 | gemm |" in out
        assert "| 35.0 | 1.0 | gemm -> gemm |" not in out and "| 5.0 | 0.5 | gemm -> norm |" in out
    empty = subprocess.run([sys.executable, str(SUMMARY), str(tmp_path / "none")], capture_output=True, text=True)
    assert empty.returncode != 0 and "no trace under" in empty.stderr
