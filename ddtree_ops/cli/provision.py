"""`ddtree-ops provision [--hosts H1,H2] [--plan]`: the immutable engine environment on each host."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from ..exceptions import CheckFailed
from ..provision import plan as planning
from ..provision import run as provisioning
from .common import (
    emit_json,
    hosts_from,
    hosts_option,
    json_option,
    next_step,
    positional_hosts_argument,
    project_from,
    say,
    seams_from,
)
from .plan import handle_plan, plan_options


@click.command(
    epilog="""\b
Examples:
  ddtree-ops provision --plan                         # the lock each host would get; changes nothing
  ddtree-ops provision --plan --hosts gpu-3 --facts gpu-3.json   # plan for a host you cannot reach yet
  ddtree-ops provision                                # every host in the project file
  ddtree-ops provision --hosts gpu-1,gpu-2 --json     # only these; one JSON document on stdout

\b
Exit codes:
  0  every host is provisioned and verified (with --plan: every host has a lock)
  1  a host failed: unreachable, no lock fits, the build or its ABI manifest failed
  2  bad input (project file, unknown host, --facts without --plan): no host was touched
"""
)
@hosts_option
@positional_hosts_argument
@plan_options
@click.option(
    "--connect-timeout", "connect_timeout_s", type=click.IntRange(1, 120), default=planning.DEFAULT_CONNECT_TIMEOUT_S,
    show_default=True, help="With --plan: SSH connect timeout per host, seconds (hosts are probed in parallel).",
)  # fmt: skip
@json_option
@click.pass_context
def provision(
    ctx: click.Context,
    hosts: tuple[str, ...],
    positional_hosts: tuple[str, ...],
    plan: bool,
    facts_file: str | None,
    gpu_archs: tuple[str, ...],
    connect_timeout_s: int,
    json_: bool,
) -> None:
    """Build /opt/ddtree/envs/<lock-hash> on each host (every host unless --hosts names some).

    The wheelhouse is built on this machine, so hosts need no network. A host whose
    environment is already complete is left alone and reported "up to date". With
    engine.install.mode container, the image ddtree-engine:<lock-hash> is built here
    from that wheelhouse and streamed to each host's Docker instead. Every environment
    is then verified on its host (ABI manifest, stored beside it); a failed manifest
    exits 1 and `deploy` refuses that host.
    """
    project = project_from(ctx, api_key=False)  # provision builds envs; the key goes to hosts with deploy
    # unknown names: ConfigError (exit 2) before any host is touched
    selected = project.select_hosts(hosts_from("provision", hosts, positional_hosts))
    seams = seams_from(ctx)
    if handle_plan(
        ctx, project, selected, plan, facts_file, gpu_archs, json_,
        connect_timeout_s=connect_timeout_s, transport=seams.transport, progress=say,
    ):  # fmt: skip
        return
    provisioning.check_supported(project)
    report = provisioning.provision(
        project,
        selected,
        progress=lambda line: click.echo(f"  docker build | {line}", err=True),
        transport=seams.transport,
        run_playbook=seams.run_playbook,
    )
    if json_:
        emit_json(report.to_dict())
    else:
        _render(report)
    if not report.ok:
        raise CheckFailed(report.failure())
    if not json_:
        next_step(ctx, "ddtree-ops deploy", "the project file's budget/topk; override with --budget N --topk K")


def _render(report: provisioning.ProvisionReport) -> None:
    table = Table(title="provision", title_justify="left")
    container_mode = any(row.image for row in report.hosts)
    for column in ("host", "address", "status", "image" if container_mode else "env", "python", "changed", "ABI manifest"):
        table.add_column(column)
    for row in report.hosts:
        status = f"[green]{row.status}[/green]" if row.status == "up to date" else f"[cyan]{row.status}[/cyan]"
        manifest = f"[green]{row.manifest}[/green]" if row.manifest_ok else f"[red]{row.manifest}[/red]"
        table.add_row(row.host, row.address, status, row.image or row.env, row.python, str(row.changed), manifest)
    Console().print(table)
    for row in report.hosts:
        click.echo(row.line())
    click.echo(f"log: {report.log_path}", err=True)
    click.echo("timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in report.timings_s.items()), err=True)
