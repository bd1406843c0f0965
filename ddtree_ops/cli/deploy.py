"""`ddtree-ops deploy` and `ddtree-ops rollback`."""

from __future__ import annotations

import os

import click
from rich.console import Console
from rich.table import Table

from ..deploy.gate import systemd_unit_probe
from ..deploy.outcomes import DeployReport, RollbackReport
from ..deploy.plan import plan_deploy
from ..deploy.rollback import execute_rollback
from ..deploy.rollout import execute_deploy, stored_manifest_gate
from ..deploy.undeploy import execute_undeploy
from ..exceptions import ConfigError
from .common import emit_json, json_option, project_from, say, seams_from

API_KEY_ENV = "DDTREE_API_KEY"


def _names(value: str | None, option: str) -> list[str] | None:
    if value is None:
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"{option} needs at least one name (comma-separated)")
    return names


def _table(report: DeployReport | RollbackReport, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("host", "service", "status", "release", "healthy after", "detail"):
        table.add_column(column)
    for host in report.hosts:
        for s in host.services:
            after = f"{s.healthy_after_s:.1f}s" if s.healthy_after_s is not None else "-"
            color = {"healthy": "green", "rolled back": "yellow", "skipped": "dim"}.get(s.status, "red")
            if s.status == "unchanged":
                color = "dim"
            detail = s.detail if len(s.detail) <= 60 else s.detail[:57] + "..."
            table.add_row(host.host, s.service, f"[{color}]{s.status}[/{color}]", s.release_id or "-", after, detail)
    return table


def _render(ctx: click.Context, report: DeployReport | RollbackReport, title: str, json_: bool) -> None:
    """The report as JSON or a table; exit 1 with the failure when the rollout (or rollback) failed."""
    if json_:
        emit_json(report.to_dict())
    else:
        Console().print(_table(report, title))
    if not report.ok:
        click.echo(f"error: {report.failure}", err=True)
        ctx.exit(1)


@click.command()
@click.option(
    "--budget", type=int, default=None, help="Tree budget for the ddtree service(s) (verify width = budget + 1)."
)
@click.option("--topk", type=int, default=None, help="Candidates per depth for the ddtree service(s).")
@click.option("--services", "services_", default=None, metavar="A,B", help="Only these services (default: all).")
@click.option(
    "--hosts", "hosts_", default=None, metavar="H1,H2", help="Only these hosts (default: all), in project order."
)
@json_option
@click.pass_context
def deploy(ctx, budget, topk, services_, hosts_, json_):
    """Install the services as new releases, one host at a time, each gated on /health.

    A host whose engine environment failed (or lacks) its ABI manifest is not touched and the
    rollout stops there. A host whose services do not become healthy (or report other settings
    in /server_info) is rolled back to its previous release and the rollout stops: later hosts are untouched.
    A DDTREE_API_KEY in the environment is written to each service's env file.
    """
    project = project_from(ctx)
    plan = plan_deploy(
        project,
        budget=budget,
        topk=topk,
        services=_names(services_, "--services"),
        hosts=_names(hosts_, "--hosts"),
        api_key=os.environ.get(API_KEY_ENV) or None,
    )
    for warning in plan.warnings:
        click.echo(f"warning: {warning}", err=True)
    seams = seams_from(ctx)
    report = execute_deploy(
        plan,
        progress=say,
        run_playbook=seams.run_playbook,
        unit_probe=systemd_unit_probe(plan.project, seams.transport),
        env_gate=stored_manifest_gate(plan.project, seams.transport),
    )
    _render(ctx, report, f"deploy {report.deploy_id}", json_)


@click.command()
@click.option("--services", "services_", default=None, metavar="A,B", help="Only these services (default: all).")
@click.option("--hosts", "hosts_", default=None, metavar="H1,H2", help="Only these hosts (default: all).")
@json_option
@click.pass_context
def rollback(ctx, services_, hosts_, json_):
    """Point services back at their previous release and restart them, one host at a time.

    Services without a previous release are left as they are.
    """
    project = project_from(ctx)
    seams = seams_from(ctx)
    report = execute_rollback(
        project,
        services=_names(services_, "--services"),
        hosts=_names(hosts_, "--hosts"),
        progress=say,
        run_playbook=seams.run_playbook,
        unit_probe=systemd_unit_probe(project, seams.transport),
    )
    _render(ctx, report, report.rollback_id, json_)


@click.command()
@click.option("--services", "services_", default=None, metavar="A,B", help="Only these services (default: all).")
@click.option("--hosts", "hosts_", default=None, metavar="H1,H2", help="Only these hosts (default: all).")
@json_option
@click.pass_context
def undeploy(ctx, services_, hosts_, json_):
    """Stop, disable and remove services from hosts, one host at a time.

    Their releases stay on disk, and so does the engine env (or image). A service no longer in
    the project file can be named with --services: it is removed wherever it is found.
    """
    project = project_from(ctx)
    report = execute_undeploy(
        project, services=_names(services_, "--services"), hosts=_names(hosts_, "--hosts"), progress=say,
        run_playbook=seams_from(ctx).run_playbook,
    )  # fmt: skip
    if json_:
        emit_json(report.to_dict())
    else:
        for row in report.hosts:
            click.echo(f"{row.host}: removed {', '.join(row.services)} (changed {row.changed})" if not row.error else f"{row.host}: failed")
    if not report.ok:
        click.echo(f"error: {report.failure}", err=True)
        ctx.exit(1)
