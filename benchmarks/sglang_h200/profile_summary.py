"""Summarise a torch-profiler chrome trace from SGLang's profiler (DIR/*.trace.json.gz): GPU time per kernel.

    python profile_summary.py DIR [STEPS]
Prints the GPU busy time, the number of kernel launches and the top kernels by total time, divided by STEPS
(the forward steps the trace holds; step_cost.py records 12, the first a short prefill).
"""
import collections, glob, gzip, json, sys

folder = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
files = sorted(glob.glob(f"{folder}/**/*.trace.json.gz", recursive=True)) or sorted(glob.glob(f"{folder}/**/*.json", recursive=True))
if not files:
    raise SystemExit(f"no trace under {folder}")
with (gzip.open if files[0].endswith(".gz") else open)(files[0], "rt") as f:
    trace = json.load(f)
events = trace["traceEvents"] if isinstance(trace, dict) else trace
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
print(f"trace {files[0].split('/')[-1]}: {len(kernels)} GPU ops over {steps} steps; GPU busy {total / steps:.1f} us/step, "
      f"span {span / steps:.1f} us/step, idle {(span - total) / steps:.1f} us/step, {len(kernels) / steps:.1f} launches/step")
print("| us/step | launches/step | kernel |")
print("|---|---|---|")
for name, (dur, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:30]:
    print(f"| {dur / steps:.1f} | {n / steps:.1f} | {name[:110]} |")
