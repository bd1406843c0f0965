"""Two arms' host steps side by side, from torch-profiler traces recorded with Python stacks
(`PROFILE_STACK=1` for step_cost.py; SGLang's profiler writes DIR/*.trace.json.gz).

    python profile_compare.py BASE_DIR OTHER_DIR [MIN_US]

Per decode step (every `run_batch` of the scheduler's thread but the first, a prefill), each arm's
call tree (Python functions, torch ops, CUDA runtime calls) is summed by call path and divided by
the steps (each worker's forward_batch_generation under one name, the DDTREE worker's _tree_decode
and _draft_hidden left out of the paths, so the two workers' shared SGLang calls line up); the two
trees are printed merged, heaviest first, with BASE, OTHER and OTHER - BASE in
us per step, down to MIN_US (default 50). Then the same-code check: functions that both arms call
equally often (24+ calls) and spend 200+ us in, OTHER's time over BASE's, the median and a spread.
If that median is far from 1, the arms' processes ran the same code at different speeds (the host,
its CPU placement, the tracer's overhead), and differences in the tree above are not all the arm's
own work. Times are under the Python tracer: compare them with each other, not with untraced runs.
"""
from __future__ import annotations

import collections
import glob
import gzip
import json
import re
import statistics
import sys

KINDS = {"python_function": "", "cpu_op": "op:", "cuda_runtime": "cuda:"}
# So the arms' trees line up: each worker's step is one name, and the DDTREE worker's own wrappers
# (the decode step, the drafter call) are left out of the paths (their children move up a level).
WORKER_STEP = re.compile(r"(speculative/dflash_worker_v2\.py|speculative/eagle_worker\w*\.py|ddtree_engine/sglang_plugin/worker\.py)\(\d+\): forward_batch_generation")
COLLAPSED = re.compile(r"ddtree_engine/sglang_plugin/worker\.py\(\d+\): (_tree_decode|_draft_hidden)$")


def read_trace(folder: str) -> tuple[str, list[dict]]:
    """The first torch-profiler trace under `folder` (DIR/**/*.trace.json.gz, else a .json; gzip or not;
    a dict with traceEvents or a bare list): its file name and events. profile_summary.py reads with it too."""
    files = sorted(glob.glob(f"{folder}/**/*.trace.json.gz", recursive=True)) or sorted(glob.glob(f"{folder}/**/*.json", recursive=True))
    if not files:
        raise SystemExit(f"no trace under {folder}")
    with (gzip.open if files[0].endswith(".gz") else open)(files[0], "rt") as f:
        trace = json.load(f)
    return files[0].split("/")[-1], trace["traceEvents"] if isinstance(trace, dict) else trace


def load(folder: str) -> list[dict]:
    return [e for e in read_trace(folder)[1] if e.get("ph") == "X" and e.get("cat") in KINDS]


def short(event: dict) -> str:
    name = event["name"]
    if event["cat"] == "python_function":
        name = name.split("site-packages/")[-1].split("/src/")[-1].replace("sglang/srt/", "")
        name = name.split(" object at 0x")[0][:90]
        return "(the worker's step: forward_batch_generation)" if WORKER_STEP.fullmatch(name) else name
    return KINDS[event["cat"]] + name[:60]


def step_tree(events: list[dict]) -> tuple[dict[tuple, float], int]:
    """Inclusive us per step by call path under each decode step's run_batch."""
    steps = sorted((e for e in events if e["cat"] == "python_function" and e["name"].endswith("run_batch")), key=lambda e: e["ts"])[1:]
    if not steps:
        raise SystemExit("no decode step (run_batch) in the trace: was it recorded with Python stacks (PROFILE_STACK=1)?")
    tree: dict[tuple, float] = collections.defaultdict(float)
    for step in steps:
        end = step["ts"] + step["dur"]
        inside = sorted((e for e in events if e.get("tid") == step.get("tid") and step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= end),
                        key=lambda e: (e["ts"], -e["dur"]))
        stack: list[tuple[float, tuple]] = []
        for e in inside:
            while stack and e["ts"] + e["dur"] > stack[-1][0] + 0.01:
                stack.pop()
            name = short(e)
            parent = stack[-1][1] if stack else ()
            path = parent if COLLAPSED.search(name) else parent + (name,)
            if path != parent:
                tree[path] += e["dur"] / len(steps)
            stack.append((e["ts"] + e["dur"], path))
    return tree, len(steps)


def merged_rows(base: dict[tuple, float], other: dict[tuple, float], min_us: float) -> list[tuple[int, str, float, float]]:
    """(depth, name, base us, other us) depth-first, children by the larger of the two, both trees merged by name."""
    children = collections.defaultdict(set)
    for path in list(base) + list(other):
        children[path[:-1]].add(path[-1])
    rows = []

    def walk(prefix: tuple, depth: int) -> None:
        names = sorted(children.get(prefix, ()), key=lambda n: -max(base.get(prefix + (n,), 0.0), other.get(prefix + (n,), 0.0)))
        for name in names:
            a, b = base.get(prefix + (name,), 0.0), other.get(prefix + (name,), 0.0)
            if max(a, b) >= min_us:
                rows.append((depth, name, a, b))
                walk(prefix + (name,), depth + 1)

    walk((), 0)
    return rows


def same_code_ratios(base: list[dict], other: list[dict]) -> list[tuple[float, int, str]]:
    """OTHER / BASE time of Python functions both call equally often (24+ calls, 200+ us in BASE), by
    their own names, leaving out those around a worker's step (their time holds the arm's own work)."""
    def totals(events):
        steps = [e for e in events if e["cat"] == "python_function" and WORKER_STEP.search(e["name"])]
        around = {e["name"] for e in events for w in steps
                  if e["cat"] == "python_function" and e["ts"] <= w["ts"] and w["ts"] + w["dur"] <= e["ts"] + e["dur"]}
        t = collections.defaultdict(lambda: [0, 0.0])
        for e in events:
            if e["cat"] == "python_function" and e["name"] not in around:
                t[e["name"].split(" object at 0x")[0]][0] += 1
                t[e["name"].split(" object at 0x")[0]][1] += e["dur"]
        return t
    a, b = totals(base), totals(other)
    return sorted((b[k][1] / a[k][1], a[k][0], k) for k in a if k in b and a[k][0] == b[k][0] >= 24 and a[k][1] >= 200)


def main(argv: list[str]) -> None:
    base_dir, other_dir = argv[1], argv[2]
    min_us = float(argv[3]) if len(argv) > 3 else 50.0
    base_events, other_events = load(base_dir), load(other_dir)
    (base, n_base), (other, n_other) = step_tree(base_events), step_tree(other_events)
    total = lambda tree: sum(v for k, v in tree.items() if len(k) == 1)
    print(f"decode steps: {n_base} and {n_other}; run_batch {total(base):.0f} and {total(other):.0f} us/step (traced)")
    print("| base us/step | other us/step | other - base | call path (indented) |")
    print("|---:|---:|---:|---|")
    for depth, name, a, b in merged_rows(base, other, min_us):
        print(f"| {a:.0f} | {b:.0f} | {b - a:+.0f} | {'. ' * depth}{name} |")
    ratios = same_code_ratios(base_events, other_events)
    if ratios:
        values = [r[0] for r in ratios]
        print(f"\nsame code, other/base over {len(ratios)} functions: median {statistics.median(values):.2f}, "
              f"10th-90th percentile {values[len(values) // 10]:.2f}-{values[(9 * len(values)) // 10]:.2f}")


if __name__ == "__main__":
    main(sys.argv)
