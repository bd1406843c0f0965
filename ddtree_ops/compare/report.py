"""The maths and the files of a baseline-vs-tree comparison.

Pure functions (medians, speedups, geometric means, the lossless check) plus the writers of
`compare.json`, `compare.md` and `compare.png`. Nothing here talks to a host.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

from ..service.metrics_text import ACCEPT_DEFINITION

# Printed under every compare table (terminal and Markdown): which acceptance the columns show.
ACCEPT_FOOTNOTE = f"{ACCEPT_DEFINITION} (from /metrics counter deltas around each run; median over runs)"


class RunLike(Protocol):
    """What the maths needs from one measured request (compare.RunResult has these)."""

    decode_tps: float | None
    ttft_s: float | None
    accept_length: float | None
    completion_tokens: int | None
    token_ids: list[int] | None  # when the server returned them
    text: str
    error: str | None


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values that are present; None when none is."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return statistics.median(present)


def speedup(baseline_tps: float | None, tree_tps: float | None) -> float | None:
    """tree ÷ baseline decode throughput; None when either is missing or the baseline is 0."""
    if baseline_tps is None or tree_tps is None or baseline_tps <= 0:
        return None
    return tree_tps / baseline_tps


def geomean(values: Iterable[float | None]) -> float | None:
    """The geometric mean of the present values (the right average for ratios); None when none is.

    Raises:
        ValueError: for a value <= 0, which has no logarithm and means a broken measurement.
    """
    present = [v for v in values if v is not None]
    if not present:
        return None
    for v in present:
        if v <= 0:
            raise ValueError(f"expected positive ratios for a geometric mean, got {v}")
    return math.exp(math.fsum(math.log(v) for v in present) / len(present))


def relative_delta(baseline: float | None, tree: float | None) -> float | None:
    """(tree − baseline) ÷ baseline, e.g. 0.25 for 25 % more; None when undefined."""
    if baseline is None or tree is None or baseline == 0:
        return None
    return (tree - baseline) / baseline


def decode_tokens_per_s(completion_tokens: int | None, t_first_token: float | None, t_last_token: float | None) -> float | None:
    """Decode throughput of one streamed request.

    The first token comes from the prefill, so it is excluded: (completion_tokens − 1) tokens were
    decoded between the first and the last content chunk. None when that span holds no tokens.
    """
    if completion_tokens is None or t_first_token is None or t_last_token is None:
        return None
    span = t_last_token - t_first_token
    if completion_tokens < 2 or span <= 0:
        return None
    return (completion_tokens - 1) / span


@dataclass(frozen=True)
class ArmStats:
    """One arm (service) on one prompt, over its runs."""

    runs: int
    errors: int
    decode_tps: float | None  # median over runs
    ttft_s: float | None  # median
    accept_length: float | None  # median of per-run Δcommitted-by-verify tokens ÷ Δverify calls
    completion_tokens: float | None  # median


def arm_stats(runs: Sequence[RunLike]) -> ArmStats:
    """Medians over one arm's runs (failed runs are counted, not averaged)."""
    ok = [r for r in runs if r.error is None]
    return ArmStats(
        runs=len(runs),
        errors=len(runs) - len(ok),
        decode_tps=median(r.decode_tps for r in ok),
        ttft_s=median(r.ttft_s for r in ok),
        accept_length=median(r.accept_length for r in ok),
        completion_tokens=median(r.completion_tokens for r in ok),
    )


@dataclass(frozen=True)
class LosslessResult:
    ok: bool
    detail: str  # where the first difference is, or what was compared


def _first_difference(a: Sequence, b: Sequence) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def lossless_check(baseline_outputs: Sequence[Sequence], tree_outputs: Sequence[Sequence], unit: str) -> LosslessResult:
    """At temperature 0 every run of both arms must produce the same output.

    Args:
        baseline_outputs: one output per successful baseline run (a token-id tuple, or the text).
        tree_outputs: the same for the tree arm.
        unit: "token" or "character", for the message.

    Returns:
        ok, and a message naming the first run and position that differ.
    """
    if not baseline_outputs or not tree_outputs:
        return LosslessResult(False, "no successful run on one arm: nothing to compare")
    reference = baseline_outputs[0]
    labelled = [("baseline", i, o) for i, o in enumerate(baseline_outputs)] + [
        ("tree", i, o) for i, o in enumerate(tree_outputs)
    ]
    for arm, i, output in labelled:
        if output != reference:
            pos = _first_difference(reference, output)
            return LosslessResult(
                False,
                f"{arm} run {i} differs from baseline run 0 at {unit} {pos} "
                f"(lengths {len(reference)} vs {len(output)})",
            )
    return LosslessResult(True, f"{len(labelled)} runs identical {unit} for {unit}")


@dataclass(frozen=True)
class PromptSummary:
    host: str
    prompt: str
    baseline: ArmStats
    tree: ArmStats
    speedup: float | None
    accept_length_delta: float | None  # relative, tree vs baseline
    lossless: LosslessResult


def summarize_prompt(host: str, prompt: str, baseline_runs: Sequence[RunLike], tree_runs: Sequence[RunLike]) -> PromptSummary:
    """Compare the two arms on one prompt on one host."""
    b, t = arm_stats(baseline_runs), arm_stats(tree_runs)
    b_ok = [r for r in baseline_runs if r.error is None]
    t_ok = [r for r in tree_runs if r.error is None]
    # Token ids are the exact comparison; text is the fallback when a server does not return them.
    by_tokens = all(r.token_ids is not None for r in b_ok + t_ok)
    unit = "token" if by_tokens else "character"

    def output(r: RunLike) -> Sequence:
        return tuple(r.token_ids) if by_tokens else r.text

    return PromptSummary(
        host=host,
        prompt=prompt,
        baseline=b,
        tree=t,
        speedup=speedup(b.decode_tps, t.decode_tps),
        accept_length_delta=relative_delta(b.accept_length, t.accept_length),
        lossless=lossless_check([output(r) for r in b_ok], [output(r) for r in t_ok], unit),
    )


@dataclass(frozen=True)
class Totals:
    host_speedup: dict[str, float | None] = field(default_factory=dict)  # geomean per host
    overall_speedup: float | None = None  # geomean over every (host, prompt)


def totals(summaries: Sequence[PromptSummary]) -> Totals:
    hosts: dict[str, list[float | None]] = {}
    for s in summaries:
        hosts.setdefault(s.host, []).append(s.speedup)
    return Totals(
        host_speedup={h: geomean(v) for h, v in hosts.items()},
        overall_speedup=geomean(s.speedup for s in summaries),
    )


# ---- rendering ---------------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    """A number for a table cell; "-" when missing."""
    if value is None:
        return "-"
    return f"{value:.{digits}f}{suffix}"


def fmt_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


TABLE_COLUMNS = (
    "host",
    "prompt",
    "baseline tok/s",
    "tree tok/s",
    "speedup",
    "baseline accept",
    "tree accept",
    "baseline TTFT",
    "tree TTFT",
    "lossless",
)


def table_rows(summaries: Sequence[PromptSummary]) -> list[list[str]]:
    """The per-prompt table as strings, shared by the terminal table and the Markdown file."""
    return [
        [
            s.host,
            s.prompt,
            fmt(s.baseline.decode_tps),
            fmt(s.tree.decode_tps),
            fmt(s.speedup, 2, "x"),
            fmt(s.baseline.accept_length, 2),
            fmt(s.tree.accept_length, 2),
            fmt_ms(s.baseline.ttft_s),
            fmt_ms(s.tree.ttft_s),
            "✓" if s.lossless.ok else "✗",
        ]
        for s in summaries
    ]


def render_markdown(doc: dict[str, Any], summaries: Sequence[PromptSummary], total: Totals) -> str:
    """compare.md: settings, the per-prompt table, the geometric means, and any failure."""
    settings = doc["settings"]
    lines = [
        "# DDTree compare",
        "",
        f"- started: {doc['started_at']}",
        f"- arms: baseline = `{settings['baseline']}`, tree = `{settings['tree']}`",
        f"- runs per prompt per arm: {settings['runs']}, max tokens: {settings['max_tokens']}, temperature 0",
        f"- tree settings: budget {settings.get('budget', '-')}, topk {settings.get('topk', '-')}, "
        f"block size {settings.get('block_size', '-')} (from the tree service's /server_info)",
        "",
        "| " + " | ".join(TABLE_COLUMNS) + " |",
        "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(summaries)]
    lines += ["", ACCEPT_FOOTNOTE]
    lines += ["", "## Geometric-mean speedup (tree ÷ baseline decode tokens/s)", ""]
    for host, value in total.host_speedup.items():
        lines.append(f"- {host}: {fmt(value, 2, 'x')}")
    lines.append(f"- **overall: {fmt(total.overall_speedup, 2, 'x')}**")
    warnings = doc.get("warnings") or []
    if warnings:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in warnings]
    failures = doc.get("failures") or []
    if failures:
        lines += ["", "## Failures", ""] + [f"- {_failure_text(f)}" for f in failures]
    lossless_notes = [f"- {s.host} / {s.prompt}: {s.lossless.detail}" for s in summaries if not s.lossless.ok]
    if lossless_notes:
        lines += ["", "## Lossless check failures", ""] + lossless_notes
    return "\n".join(lines) + "\n"


def _failure_text(item: Any) -> str:
    # `{host, service, message}` (the JSON envelope's failures); a plain string from older documents.
    if not isinstance(item, dict):
        return str(item)
    where = "/".join(x for x in (item.get("host"), item.get("service")) if x)
    return f"{where}: {item['message']}" if where else str(item["message"])


def write_chart(summaries: Sequence[PromptSummary], total: Totals, path: Path) -> None:
    """compare.png: decode tokens/s per prompt, baseline and tree side by side, one row per host."""
    # Deferred on purpose: matplotlib is heavy (~1 s to import) and only the chart needs it.
    import matplotlib

    matplotlib.use("Agg")  # no display on control nodes and CI
    import matplotlib.pyplot as plt

    hosts = list(dict.fromkeys(s.host for s in summaries)) or ["(none)"]
    fig, axes = plt.subplots(len(hosts), 1, figsize=(9, 3.2 * len(hosts)), squeeze=False)
    for ax, host in zip(axes[:, 0], hosts):
        rows = [s for s in summaries if s.host == host]
        xs = range(len(rows))
        width = 0.38
        b = [s.baseline.decode_tps or 0.0 for s in rows]
        t = [s.tree.decode_tps or 0.0 for s in rows]
        # Fixed colours: with matplotlib's cycle an arm's colour depends on what was drawn before.
        ax.bar([x - width / 2 for x in xs], b, width, label="baseline", color="tab:blue")
        bars = ax.bar([x + width / 2 for x in xs], t, width, label="tree", color="tab:orange")
        for bar, s in zip(bars, rows):
            ax.annotate(
                fmt(s.speedup, 2, "x") + ("" if s.lossless.ok else " ✗"),
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_xticks(list(xs))
        ax.set_xticklabels([s.prompt for s in rows])
        ax.set_ylabel("decode tokens/s")
        ax.set_title(f"{host}: geomean speedup {fmt(total.host_speedup.get(host), 2, 'x')}")
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summary_dict(s: PromptSummary) -> dict[str, Any]:
    return asdict(s)


def write_report_files(doc: dict[str, Any], summaries: Sequence[PromptSummary], total: Totals, out_dir: Path) -> dict[str, Path]:
    """Write compare.json, compare.md and compare.png into `out_dir` (created if needed).

    Returns:
        {"json": path, "markdown": path, "chart": path}
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "compare.json", "markdown": out_dir / "compare.md", "chart": out_dir / "compare.png"}
    paths["json"].write_text(json.dumps(doc, indent=2, default=str) + "\n")
    paths["markdown"].write_text(render_markdown(doc, summaries, total))
    write_chart(summaries, total, paths["chart"])
    return paths
