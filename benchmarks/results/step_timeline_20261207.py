"""Issue 10: where the graphed budget-15 step's time goes, kernel by kernel, from the GPU's own clock (torch.profiler /
CUPTI) rather than by graphs cut after each stage (bench_tree_step's stage table). Each arm's CUDA graph is replayed
REPLAYS times, each replay after a 256 MB zero (L2 flushed, as triton.testing.do_bench does before each timed call);
per replay the kernels between two zeros are one step. Printed per arm: each kernel's median start and end against the
end of the zero before it (what the graph launch and the dependences add shows as the start of the first kernel and
the gaps), its median duration, and the step's median end (first kernel's start to last kernel's end is the span).
With PDL the kernels overlap: a kernel's programs start while the one before drains and wait in griddepcontrol.wait,
so its "duration" includes that wait, and the step's end is the number to compare.

Arms: the argmax over the same logits (`torch.argmax(..., out=)`, bench_tree_step.graphed_argmax), then for each of
--budgets (15 unless given) TreeStep(budget, 8) with PDL (the default) and with plain launches. Same logits as
bench_tree_step.py.

    PYTHONPATH=engine_patches/ddtree_engine/src python benchmarks/results/step_timeline_20261207.py [--budgets 15,22]
"""
import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, as the earlier scripts here
from bench_tree_step import DEPTHS, VOCAB, TreeStep, draws, graphed, graphed_argmax  # noqa: E402

REPLAYS = 200


def kernels_by_replay(graph, flush: torch.Tensor) -> list[list[dict]]:
    """Replay `graph` REPLAYS times, each after zeroing `flush`; return each replay's kernels (name, start and end in
    us against the end of the zero before it), from the profiler's trace."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(10):
        flush.zero_()
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            flush.zero_()
            graph.replay()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.loads(Path(f.name).read_text())
    events = sorted((e for e in trace["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    replays, zero_end, current = [], None, None
    for e in events:
        if "fill" in e["name"].lower() or "zero" in e["name"].lower():
            if current:
                replays.append(current)
            zero_end, current = e["ts"] + e["dur"], []
        elif current is not None:
            current.append({"name": e["name"], "start": e["ts"] - zero_end, "end": e["ts"] + e["dur"] - zero_end})
    if current:
        replays.append(current)
    return replays


def report(arm: str, replays: list[list[dict]]) -> dict:
    counts = {len(r) for r in replays}
    if len(counts) != 1:
        print(f"{arm}: kernels per replay differ {sorted(counts)}; the most common count only")
        n = statistics.mode(len(r) for r in replays)
        replays = [r for r in replays if len(r) == n]
    if not replays or not replays[0]:
        print(f"## {arm}: the trace holds no kernels of the graph's replays (CUPTI did not report them)")
        return {"arm": arm, "kernels": []}
    rows = []
    for i, k in enumerate(replays[0]):
        start = statistics.median(r[i]["start"] for r in replays)
        end = statistics.median(r[i]["end"] for r in replays)
        dur = statistics.median(r[i]["end"] - r[i]["start"] for r in replays)
        rows.append({"kernel": k["name"][:60], "start_us": start, "end_us": end, "dur_us": dur})
    step_end = statistics.median(max(k["end"] for k in r) for r in replays)
    span = statistics.median(max(k["end"] for k in r) - r[0]["start"] for r in replays)
    print(f"## {arm}: {len(replays)} replays; first kernel starts {rows[0]['start_us']:.2f} us after the zero, "
          f"last ends {step_end:.2f} us after it (span {span:.2f})")
    for row in rows:
        print(f"  {row['kernel']:60s} start {row['start_us']:6.2f}  end {row['end_us']:6.2f}  dur {row['dur_us']:5.2f}")
    return {"arm": arm, "kernels": rows, "end_us": step_end, "span_us": span}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--budgets", default="15")
    args = parser.parse_args()
    device = torch.device("cuda")
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}")
    ((_, logits), _), root, prefix = draws(DEPTHS, VOCAB, device)
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device=device)
    out, keep = [], []
    argmax_graph, argmax_out = graphed_argmax(logits)
    keep.append(argmax_out)
    out.append(report("argmax", kernels_by_replay(argmax_graph, flush)))
    for budget in [int(b) for b in args.budgets.split(",")]:
        for pdl in (True, False):
            step = TreeStep(DEPTHS, VOCAB, budget, 8, device, pdl=pdl)
            choices = torch.zeros(step.num_rows, dtype=torch.long, device=device)
            keep += [step, choices]

            def whole(s=step, c=choices):
                s.build(logits, root, prefix)
                s.walk(c)

            out.append(report(f"budget {budget} {'PDL' if pdl else 'plain launches'}",
                              kernels_by_replay(graphed(whole), flush)))
    print(json.dumps(out))


main()
