"""`ddtree-ops compare`: baseline vs tree on each host; a table, the report files, exit 1 on failure."""

from __future__ import annotations

import os
from pathlib import Path

import click
from rich.table import Table

from ..compare.prompts import load_prompts
from ..compare.report import ACCEPT_FOOTNOTE, TABLE_COLUMNS, fmt, table_rows
from ..compare.run import DEFAULT_STALL_S, CompareReport, default_out_dir, run_compare, write_compare_files
from ..exceptions import CheckFailed, ConfigError
from .common import emit_json, json_option, project_from, say
from .health import split_names
from .render import console


def check_out_dir(path) -> Path:
    """Refuse an --out that cannot be written before any measuring (exit 2); creates nothing."""
    out = Path(path)
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise ConfigError(
            f"--out {out}: cannot write the report there ({existing} is not a writable folder); choose another folder"
        )
    return out


def _render(report: CompareReport, files: dict) -> None:
    s = report.settings
    table = Table(
        title=f"ddtree compare: {s.baseline} vs {s.tree} ({s.runs} run(s), {s.max_tokens} max tokens, T=0; "
        f"tree budget {s.budget}, topk {s.topk}, block size {s.block_size})",
        caption=ACCEPT_FOOTNOTE,
    )
    for col in TABLE_COLUMNS:
        table.add_column(col, justify="left" if col in ("host", "prompt") else "right")
    for row in table_rows(report.summaries):
        row[-1] = "[green]✓[/green]" if row[-1] == "✓" else "[red]✗[/red]"
        table.add_row(*row)
    out = console()
    out.print(table)
    for host, value in report.totals.host_speedup.items():
        out.print(f"geomean speedup {host}: {fmt(value, 2, 'x')}")
    out.print(f"[bold]geomean speedup overall: {fmt(report.totals.overall_speedup, 2, 'x')}[/bold]")
    for w in report.warnings:
        out.print(f"[yellow]warning[/yellow] {w}")
    out.print(f"report: {files['markdown']}, {files['json']}, {files['chart']}")


@click.command("compare")
@click.option("--baseline", default="baseline", show_default=True, help="Service name of the linear arm.")
@click.option("--tree", default="tree", show_default=True, help="Service name of the tree arm.")
@click.option(
    "--prompts",
    "prompts_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="A built-in set (builtin, heldout, heldout-templates, heldout-novel) or a YAML/JSON list of prompts "
    "(strings, or {name, prompt}); default: builtin.",
)
@click.option("--runs", type=click.IntRange(min=1), default=3, show_default=True, help="Measured runs per prompt per arm.")
@click.option("--max-tokens", type=click.IntRange(min=2), default=128, show_default=True,
              help="Completion length limit per request, the same on both arms (>= 2: decode speed needs a token after the first).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, help="Report folder [default: ./ddtree-compare-<timestamp>].")
@click.option("--hosts", "hosts", multiple=True, help="Only these hosts (repeat or comma-separate).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True, help="Seconds per request.")
@click.option(
    "--stall-timeout",
    "stall_timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_STALL_S,
    show_default=True,
    help="Seconds a request may go without a byte from the server; past it the host counts as not answering and "
    "its remaining runs are skipped (the other hosts are measured).",
)
@click.option(
    "--parallel-hosts", type=click.IntRange(min=1), default=1, show_default=True,
    help="Measure this many hosts at once (each host's arms still take turns). Keep 1 when hosts share a "
    "machine (the lab); a fleet of separate machines: its host count.",
)  # fmt: skip
@json_option
@click.pass_context
def compare(
    ctx: click.Context,
    baseline: str,
    tree: str,
    prompts_file: str | None,
    runs: int,
    max_tokens: int,
    out_dir: str | None,
    hosts: tuple[str, ...],
    timeout: float,
    stall_timeout: float,
    parallel_hosts: int,
    json_: bool,
) -> None:
    """Measure the tree service against the baseline service on the same prompts.

    Every selected service must answer /health first. A host where one does not (down, unreachable)
    is not measured and is named in the report's failures while the other hosts are measured; when
    that is every host, compare says which and why, measures nothing and writes no report. The report records the tree's budget, topk and
    block size (from its /server_info) and the number of runs; --runs 1 gets a warning (noise).

    \b
    Examples:
      ddtree-ops compare --runs 3 --out report/
      ddtree-ops compare --hosts gpu-1 --prompts heldout --json
      ddtree-ops compare --parallel-hosts 8     # 8 GPU hosts measured at once

    \b
    Exit codes:
      0  measured, and every lossless check passed
      1  a service is down (that host not measured; on every host: nothing measured or written),
         a request failed (a service killed mid-run: that run; a host silent for --stall-timeout: its
         remaining runs are skipped), or a lossless check failed
      2  bad input (unknown service or host, unreadable prompts, unwritable --out); nothing contacted
    """
    project = project_from(ctx)
    prompts = load_prompts(prompts_file)
    out = check_out_dir(out_dir or default_out_dir())
    report = run_compare(
        project,
        prompts,
        baseline=baseline,
        tree=tree,
        runs=runs,
        max_tokens=max_tokens,
        host_names=split_names(hosts),
        timeout_s=timeout,
        stall_s=stall_timeout,
        progress=say,
        parallel_hosts=parallel_hosts,
    )
    files = write_compare_files(report, out)
    if json_:
        emit_json({**report.to_dict(), "files": {k: str(v) for k, v in files.items()}})
    else:
        _render(report, files)
    if not report.ok:
        raise CheckFailed("compare failed:\n  " + "\n  ".join(report.failure_lines()))
