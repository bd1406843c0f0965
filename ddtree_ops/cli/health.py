"""`ddtree-ops healthcheck`: the table (or JSON) of every service's checks; exit 1 on any failure."""

from __future__ import annotations

import click
from rich.table import Table

from ..compare.report import fmt
from ..exceptions import CheckFailed
from ..health.check import RECENT_ACCEPT_DEFINITION, HealthReport, run_healthcheck
from ..service.metrics_text import ACCEPT_DEFINITION
from .common import emit_json, json_option, project_from, say, seams_from
from .render import console


def split_names(values: tuple[str, ...]) -> list[str] | None:
    """`--hosts a,b --hosts c` -> ["a", "b", "c"]; None when the option was not given."""
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    return names or None


def _render(report: HealthReport) -> None:
    table = Table(
        title="ddtree healthcheck",
        caption=f"accept len: {ACCEPT_DEFINITION}, from /metrics counters; {RECENT_ACCEPT_DEFINITION}",
    )
    columns = ("host", "service", "unit", "restarts", "env manifest", "health", "server_info", "generation",
               "accept recent", "accept lifetime", "verdict")  # fmt: skip
    for col in columns:
        table.add_column(col)
    for r in report.results:
        unit = "-" if r.unit is None else r.unit.describe()
        restarts = "-" if r.unit is None or r.unit.restarts is None else str(r.unit.restarts)
        health = "-" if r.health_status is None else str(r.health_status)
        info = "-" if r.info is None else ("ok" if not r.info_mismatches else "MISMATCH")
        gen = "-" if r.generation_tokens is None else f"ok ({r.generation_tokens} tok)"
        manifest = "-" if r.manifest is None else r.manifest.short()
        if r.manifest is not None:
            color = {"ok": "green", "failed": "red"}.get(r.manifest.status, "yellow")
            manifest = f"[{color}]{manifest}[/{color}]"
        verdict = "[green]ok[/green]" if r.ok else "[red]FAIL[/red]"
        table.add_row(r.host, r.service, unit, restarts, manifest, health, info, gen, fmt(r.accept_length_recent, 2),
                      fmt(r.accept_length, 2), verdict)  # fmt: skip
    out = console()
    out.print(table)
    for r in report.results:
        for w in r.warnings:
            out.print(f"[yellow]warning[/yellow] {r.host}/{r.service}: {w}")


@click.command("healthcheck")
@click.option("--hosts", "hosts", multiple=True, help="Only these hosts (repeat or comma-separate).")
@click.option("--services", "services", multiple=True, help="Only these services (repeat or comma-separate).")
@click.option(
    "--no-systemd",
    is_flag=True,
    help="Skip the SSH checks (systemd unit, state.json): HTTP checks only, for servers started by hand.",
)
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True, help="Seconds per request.")
@json_option
@click.pass_context
def healthcheck(ctx: click.Context, hosts: tuple[str, ...], services: tuple[str, ...], no_systemd: bool, timeout: float, json_: bool) -> None:
    """Check every deployed service: unit, env ABI manifest, /health, /server_info, a generation, /metrics.

    Acceptance is shown twice: recent (over healthcheck's own short greedy generation: /metrics
    counter deltas around it) and lifetime (since the server started).

    \b
    Examples:
      ddtree-ops healthcheck
      ddtree-ops healthcheck --hosts gpu-1 --services tree --json
      ddtree-ops healthcheck --no-systemd      # servers started by hand: HTTP checks only

    \b
    Exit codes:
      0  every check passed (warnings allowed)
      1  a check failed (each failure listed on stderr)
      2  bad input (unknown host or service); nothing was contacted
    """
    project = project_from(ctx)
    report = run_healthcheck(
        project,
        split_names(hosts),
        split_names(services),
        check_systemd=not no_systemd,
        timeout_s=timeout,
        progress=say,
        transport=seams_from(ctx).transport,
    )
    if json_:
        emit_json(report.to_dict())
    else:
        _render(report)
    if not report.ok:
        raise CheckFailed("healthcheck failed:\n  " + "\n  ".join(report.failures()))
