"""Summarise a torch-profiler chrome trace from SGLang's profiler (DIR/*.trace.json.gz): GPU time per kernel,
where the GPU waits for the host, and the host's CUDA calls.

    python profile_summary.py DIR [STEPS]
Prints the GPU busy time, the number of kernel launches and the top kernels by total time, divided by STEPS
(the forward steps the trace holds; step_cost.py records 12, the first a short prefill). Then the GPU's idle
gaps shorter than GAP_MS (inside steps; longer ones are between requests) by the kernels on either side: the
places a step waits for its host. Then the host's CUDA runtime calls per step (launches, graph launches, syncs).
"""
import collections, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_compare import read_trace

folder = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
trace_name, events = read_trace(folder)
kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X"]
by_name = collections.defaultdict(lambda: [0.0, 0])
for e in kernels:
    name = e.get("name", "?")
    by_name[name][0] += float(e.get("dur", 0))
    by_name[name][1] += 1
total = sum(v[0] for v in by_name.values())
if kernels:
    span = max(e["ts"] + e.get("dur", 0) for e in kernels) - min(e["ts"] for e in kernels)
else:
    span = 0.0
# CPU-side time between the first and the last kernel that the GPU sat idle: launch and host overhead.
print(f"trace {trace_name}: {len(kernels)} GPU ops over {steps} steps; GPU busy {total / steps:.1f} us/step, "
      f"span {span / steps:.1f} us/step, idle {(span - total) / steps:.1f} us/step, {len(kernels) / steps:.1f} launches/step")
print("| us/step | launches/step | kernel |")
print("|---|---|---|")
for name, (dur, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:30]:
    print(f"| {dur / steps:.1f} | {n / steps:.1f} | {name[:110]} |")

GAP_MS = 2.0
ordered = sorted(kernels, key=lambda e: e["ts"])
gaps = collections.defaultdict(lambda: [0.0, 0])
short = lambda n: n.split("(")[0].split("<")[0][:48]
for a, b in zip(ordered, ordered[1:]):
    gap = b["ts"] - (a["ts"] + a.get("dur", 0))
    if 0 < gap < GAP_MS * 1000:
        key = f"{short(a.get('name', '?'))} -> {short(b.get('name', '?'))}"
        gaps[key][0] += gap
        gaps[key][1] += 1
in_step = sum(v[0] for v in gaps.values())
print(f"\nGPU idle in gaps < {GAP_MS} ms: {in_step / steps:.1f} us/step (the host behind the GPU)")
print("| idle us/step | gaps/step | after -> before |")
print("|---|---|---|")
for key, (dur, n) in sorted(gaps.items(), key=lambda kv: -kv[1][0])[:15]:
    print(f"| {dur / steps:.1f} | {n / steps:.1f} | {key} |")
runtime = [e for e in events if e.get("cat") == "cuda_runtime" and e.get("ph") == "X"]
calls = collections.defaultdict(lambda: [0.0, 0])
for e in runtime:
    calls[e.get("name", "?")][0] += float(e.get("dur", 0))
    calls[e.get("name", "?")][1] += 1
print("\n| host us/step | calls/step | CUDA runtime call |")
print("|---|---|---|")
for name, (dur, n) in sorted(calls.items(), key=lambda kv: -kv[1][1])[:12]:
    print(f"| {dur / steps:.1f} | {n / steps:.1f} | {name[:60]} |")
cpu_ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
print(f"\n{len(cpu_ops) / steps:.1f} torch ops/step on the host")
# Python functions (traces recorded with PROFILE_STACK=1): inclusive host time per step, the project's and SGLang's
# own code only (a function that recurses counts once per level).
python = [e for e in events if e.get("cat") == "python_function" and e.get("ph") == "X"]
if python:
    funcs = collections.defaultdict(lambda: [0.0, 0])
    for e in python:
        name = e.get("name", "?")
        if "ddtree_engine" in name or "sglang" in name:
            funcs[name][0] += float(e.get("dur", 0))
            funcs[name][1] += 1
    print("\n| host us/step (inclusive) | calls/step | Python function |")
    print("|---|---|---|")
    for name, (dur, n) in sorted(funcs.items(), key=lambda kv: -kv[1][0])[:60]:
        short_name = name.split("site-packages/")[-1].split("/src/")[-1]
        print(f"| {dur / steps:.1f} | {n / steps:.1f} | {short_name[:100]} |")
