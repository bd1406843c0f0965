"""`ddtree-ops provision [HOST…]`: the immutable engine environment on each host."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from ..exceptions import CheckFailed
from ..provision import run as provisioning
from .common import emit_json, json_option, project_from, seams_from
from .plan import handle_plan, plan_options


@click.command()
@click.argument("host_names", metavar="[HOST]...", nargs=-1)
@plan_options
@json_option
@click.pass_context
def provision(
    ctx: click.Context,
    host_names: tuple[str, ...],
    plan: bool,
    facts_file: str | None,
    gpu_archs: tuple[str, ...],
    json_: bool,
) -> None:
    """Build /opt/ddtree/envs/<lock-hash> on each host (all hosts when none are named).

    The wheelhouse is built on this machine, so hosts need no network. A host whose
    environment is already complete is left alone and reported "up to date". With
    engine.install.mode container, the image ddtree-engine:<lock-hash> is built here
    from that wheelhouse and streamed to each host's Docker instead. Every environment
    is then verified on its host (ABI manifest, stored beside it); a failed manifest
    exits 1 and `deploy` refuses that host.
    """
    project = project_from(ctx)
    hosts = project.select_hosts(host_names)  # unknown names: ConfigError (exit 2) before any host is touched
    if handle_plan(ctx, project, hosts, plan, facts_file, gpu_archs, json_):
        return
    provisioning.check_supported(project)
    seams = seams_from(ctx)
    report = provisioning.provision(
        project,
        hosts,
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
