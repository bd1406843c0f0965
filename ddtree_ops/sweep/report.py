"""The sweep's figures and files: one row per configuration, the recommendation, and
`sweep.json`, `sweep.md`, `sweep.png`. Pure apart from the writers; nothing here talks to a host."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from ..compare.report import fmt, fmt_ms, geomean, median
from ..service.metrics_text import ACCEPT_DEFINITION
from .plan import SweepConfig
from .state import CELL_OK

WIDTH_EQUAL = "= block"  # verify width budget + 1 equals the block size: the linear baseline's cost
TABLE_COLUMNS = ("budget", "topk", "verify width", "tokens/step", "tree tok/s", "speedup", "TTFT", "lossless", "hosts ok")


def width_mark(verify_width: int, block_size: int | None) -> str:
    """`= block` when budget + 1 equals the block size (the rule operators tune by), else `> block`/`< block`."""
    if block_size is None:
        return "?"
    if verify_width == block_size:
        return WIDTH_EQUAL
    return "> block" if verify_width > block_size else "< block"


def config_rows(configs: Sequence[SweepConfig], hosts: Sequence[str], cells: dict[str, dict[str, Any]],
                block_size: int | None) -> list[dict[str, Any]]:  # fmt: skip
    """One row per configuration over every host's cell.

    Speedup is the geometric mean of the per-(host, prompt) speedups (as compare's overall figure);
    tokens/step, tok/s and TTFT are medians over the hosts' medians. `lossless` is True only when
    every host measured it and every prompt was identical (False when one host differed, None while
    a host is missing); `complete` says every host measured it.
    """
    rows = []
    for config in configs:
        mine = [cells.get(f"{config.key}/{h}") or {"host": h, "status": None} for h in hosts]
        ok = [c for c in mine if c.get("status") == CELL_OK]
        speedups = [p.get("speedup") for c in ok for p in c.get("prompts") or []]
        rows.append({
            "config": config.key, "budget": config.budget, "topk": config.topk,
            "verify_width": config.verify_width, "block_size": block_size,
            "width_rule": width_mark(config.verify_width, block_size),
            "tokens_per_step": median(c.get("tokens_per_step") for c in ok),
            "tree_tps": median(c.get("tree_tps") for c in ok),
            "baseline_tps": median(c.get("baseline_tps") for c in ok),
            "speedup": geomean(s for s in speedups if s is not None and s > 0),
            "ttft_s": median(c.get("ttft_s") for c in ok),
            "lossless": _lossless(ok, len(mine)),
            "complete": len(ok) == len(mine),
            "hosts_ok": len(ok), "hosts": len(mine),
            "statuses": {c["host"]: c.get("status") for c in mine},
        })  # fmt: skip
    return rows


def _lossless(ok: list[dict[str, Any]], cells: int) -> bool | None:
    # ✗ as soon as one measured host differed; ✓ only when every host measured it identical;
    # unknown ("-") while a host is missing: a host not measured proves nothing.
    if any(not c.get("lossless") for c in ok):
        return False
    return True if ok and len(ok) == cells else None


def recommend(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The best lossless configuration by geometric-mean speedup, measured on every host, and its
    margin over the runner-up (best ÷ runner-up − 1); None when no configuration qualifies."""
    candidates = sorted(
        (r for r in rows if r["complete"] and r["lossless"] and r["speedup"] is not None),
        key=lambda r: r["speedup"],
        reverse=True,
    )
    if not candidates:
        return None
    best = candidates[0]
    runner_up = candidates[1] if len(candidates) > 1 else None
    return {
        "config": best["config"], "budget": best["budget"], "topk": best["topk"], "speedup": best["speedup"],
        "runner_up": None if runner_up is None else {
            "config": runner_up["config"], "budget": runner_up["budget"], "topk": runner_up["topk"], "speedup": runner_up["speedup"],
        },
        "margin": None if runner_up is None else best["speedup"] / runner_up["speedup"] - 1,
    }  # fmt: skip


def host_bests(configs: Sequence[SweepConfig], hosts: Sequence[str], cells: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per host: its best lossless measured configuration by that host's geomean speedup (None if none)."""
    out: dict[str, Any] = {}
    for host in hosts:
        mine = [cells.get(f"{c.key}/{host}") or {} for c in configs]
        good = [c for c in mine if c.get("status") == CELL_OK and c.get("lossless") and c.get("speedup") is not None]
        best = max(good, key=lambda c: c["speedup"], default=None)
        out[host] = None if best is None else {"config": best["config"], "budget": best["budget"], "topk": best["topk"],
                                                "speedup": best["speedup"]}  # fmt: skip
    return out


def recommendation_line(rec: dict[str, Any] | None) -> str:
    if rec is None:
        return "no recommendation: no lossless configuration was measured on every host"
    line = f"recommended: budget {rec['budget']}, topk {rec['topk']} (geomean speedup {fmt(rec['speedup'], 2, 'x')})"
    if rec["runner_up"] is not None:
        r = rec["runner_up"]
        line += (f", {rec['margin'] * 100:+.1f}% over the runner-up budget {r['budget']}, topk {r['topk']} "
                 f"({fmt(r['speedup'], 2, 'x')})")  # fmt: skip
    return line


def table_rows(rows: Sequence[dict[str, Any]]) -> list[list[str]]:
    """The per-configuration table as strings (terminal and Markdown)."""
    out = []
    for r in rows:
        lossless = "-" if r["lossless"] is None else ("✓" if r["lossless"] else "✗")
        out.append([
            str(r["budget"]), str(r["topk"]), f"{r['verify_width']} ({r['width_rule']})", fmt(r["tokens_per_step"], 2),
            fmt(r["tree_tps"]), fmt(r["speedup"], 2, "x"), fmt_ms(r["ttft_s"]), lossless, f"{r['hosts_ok']}/{r['hosts']}",
        ])  # fmt: skip
    return out


def render_markdown(doc: dict[str, Any]) -> str:
    """sweep.md: settings, the table, the recommendation, per-host bests, where each service was left, failures."""
    s = doc["settings"]
    lines = [
        "# DDTree budget/topk sweep", "",
        f"- started: {doc['started_at']}; hosts: {', '.join(s['hosts'])}; tree service `{s['tree']}` against `{s['baseline']}`",
        f"- {s['runs']} run(s) per prompt per arm, {s['max_tokens']} max tokens, temperature 0, "
        f"{len(s['prompts'])} prompt(s); block size {s['block_size']}",
        f"- verify width = budget + 1; `{WIDTH_EQUAL}` marks the configurations that verify as many tokens per step as the linear baseline",
        "", "| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|",
    ]  # fmt: skip
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(doc["configs"])]
    lines += ["", f"tokens/step: {ACCEPT_DEFINITION}; speedup: tree ÷ baseline decode tokens/s, geometric mean over hosts and prompts.",
              "", f"**{recommendation_line(doc['recommendation'])}**", "", "## Per host", ""]  # fmt: skip
    for h in doc["hosts"]:
        best = h["best"]
        best_text = "none" if best is None else f"budget {best['budget']}, topk {best['topk']} ({fmt(best['speedup'], 2, 'x')})"
        lines.append(f"- {h['host']}: best {best_text}; before the sweep {_config_text(h['original'])}; "
                     f"now {_config_text(h['final'])}")  # fmt: skip
    if doc.get("applied"):
        a = doc["applied"]
        lines += ["", f"Applied at the end: budget {a['budget']}, topk {a['topk']} ({a['why']})."]
    for title, items in (("Warnings", doc["warnings"]), ("Failures", [_failure_text(f) for f in doc["failures"]])):
        if items:
            lines += ["", f"## {title}", ""] + [f"- {i}".replace("\n", "\n  ") for i in items]
    return "\n".join(lines) + "\n"


def _config_text(c: dict[str, Any] | None) -> str:
    if not c or c.get("budget") is None:
        return "unknown"
    return f"budget {c['budget']}, topk {c['topk']} (release {c.get('release_id') or '?'})"


def _failure_text(f: dict[str, Any]) -> str:
    where = "/".join(x for x in (f.get("host"), f.get("service")) if x)
    return f"{where}: {f['message']}" if where else f["message"]


def write_chart(doc: dict[str, Any], path: Path) -> None:
    """sweep.png: tokens/step and tree tok/s against budget, one line per topk; the budget whose
    verify width equals the block size is marked; a configuration that was not lossless is an ✗."""
    # Deferred on purpose: matplotlib is heavy (~1 s to import) and only the chart needs it.
    import matplotlib

    matplotlib.use("Agg")  # no display on control nodes and CI
    import matplotlib.pyplot as plt

    rows = doc["configs"]
    block = doc["settings"]["block_size"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "tokens_per_step", "tokens per verify step"), (axes[1], "tree_tps", "tree decode tokens/s")):
        for topk in sorted({r["topk"] for r in rows}):
            mine = sorted((r for r in rows if r["topk"] == topk and r[key] is not None), key=lambda r: r["budget"])
            if not mine:
                continue
            line = ax.plot([r["budget"] for r in mine], [r[key] for r in mine], marker="o", label=f"topk {topk}")[0]
            for r in mine:
                if r["lossless"] is False:
                    ax.plot([r["budget"]], [r[key]], marker="x", markersize=12, color="red")
            line.set_linewidth(1.5)
        if block:
            ax.axvline(block - 1, color="grey", linestyle="--", linewidth=1)
            ax.annotate(f"verify width = block size ({block})", (block - 1, ax.get_ylim()[1]), rotation=90,
                        va="top", ha="right", fontsize=8, color="grey")  # fmt: skip
        ax.set_xlabel("budget")
        ax.set_ylabel(label)
        if ax.get_legend_handles_labels()[0]:  # no line at all when every configuration failed
            ax.legend(fontsize=8)
    rec = doc.get("recommendation")
    fig.suptitle("DDTree sweep: " + (f"recommended budget {rec['budget']}, topk {rec['topk']}" if rec else "no recommendation"))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report_files(doc: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write sweep.json, sweep.md and sweep.png into `out_dir`; returns {"json", "markdown", "chart"} paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "sweep.json", "markdown": out_dir / "sweep.md", "chart": out_dir / "sweep.png"}
    paths["json"].write_text(json.dumps(doc, indent=2, default=str) + "\n")
    paths["markdown"].write_text(render_markdown(doc))
    write_chart(doc, paths["chart"])
    return paths
