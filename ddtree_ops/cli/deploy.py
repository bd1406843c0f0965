"""`ddtree-ops deploy` and `ddtree-ops rollback`."""

from __future__ import annotations

import os
import sys

import click
from rich.table import Table

from ..deploy.gate import systemd_unit_probe
from ..deploy.outcomes import DeployInterrupted, DeployReport, RollbackReport
from ..deploy.plan import plan_deploy
from ..deploy.rollback import execute_rollback
from ..deploy.rollout import execute_deploy, stored_manifest_gate
from ..deploy.undeploy import execute_undeploy, plan_undeploy
from ..exceptions import ConfigError
from ..service.api_key import API_KEY_ENV
from .common import (
    emit_json, hosts_option, json_option, lock_timeout_option, locked, project_from, say, seams_from, split_names,
)  # fmt: skip
from .render import console

def _names(value: str | None, option: str) -> list[str] | None:
    if value is None:
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise ConfigError(f"{option} needs at least one name (comma-separated)")
    return names


def _table(report: DeployReport | RollbackReport, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("host", "service", "status", "settings", "release", "healthy after", "detail"):
        table.add_column(column)
    colors = {"healthy": "green", "rolled back": "yellow", "skipped": "dim", "unchanged": "dim"}
    for host in report.hosts:
        for s in host.services:
            # A service nobody restarted was not "healthy after 0.0s": it was already up.
            after = f"{s.healthy_after_s:.1f}s" if s.healthy_after_s is not None and s.release_changed else "-"
            color = colors.get(s.status, "red")
            table.add_row(host.host, s.service, f"[{color}]{s.status}[/{color}]", s.settings(), s.release_id or "-",
                          after, s.detail)  # fmt: skip
    return table


def _render(ctx: click.Context, report: DeployReport | RollbackReport, title: str, json_: bool) -> None:
    """The report as JSON or a table; exit 1 with the failure when the rollout (or rollback) failed."""
    if json_:
        emit_json(report.to_dict())
    else:
        out = console()
        out.print(_table(report, title))
        changed = any(s.release_changed for h in report.hosts for s in h.services)
        if report.ok and not changed:
            out.print("up to date, nothing changed")
        if isinstance(report, RollbackReport):  # deploy's warnings were printed before it started
            for warning in report.warnings:
                click.echo(f"warning: {warning}", err=True)
    if not report.ok:
        click.echo(f"error: {report.failure}", err=True)
        ctx.exit(1)


@click.command()
@click.option(
    "--budget", type=int, default=None, help="Tree budget for the ddtree service(s) (verify width = budget + 1)."
)
@click.option("--topk", type=int, default=None, help="Candidates per depth for the ddtree service(s).")
@click.option("--services", "services_", default=None, metavar="A,B", help="Only these services (default: all).")
@hosts_option
@lock_timeout_option
@json_option
@click.pass_context
def deploy(ctx, budget, topk, services_, hosts, lock_timeout, json_):
    """Install the services as new releases, one host at a time, each gated on /health.

    A host whose engine environment failed (or lacks) its ABI manifest is not touched and the
    rollout stops there. A host whose services do not become healthy (or report other settings
    in /server_info) is rolled back to its previous release and the rollout stops: later hosts are untouched.
    The API key (the project file's api_key_env or api_key_file, else $DDTREE_API_KEY) is written to each
    service's env file (0600) and nowhere else on the host. A service whose
    release is already installed is left alone: a second identical deploy says "up to date,
    nothing changed" and shows the settings deployed. Each host is locked on the host for the whole run
    (/var/lib/ddtree/deploy.lock): a second deploy, rollback, undeploy or sweep of it waits up to
    --lock-timeout, then exits 1 naming the run that holds it; the lock ends with its run, even a killed one.

    \b
    Examples:
      ddtree-ops deploy --budget 15 --topk 8
      ddtree-ops deploy --hosts gpu-2 --services tree --json

    \b
    Exit codes:
      0  every service healthy (or already up to date)
      1  a host was refused or failed its gate (it was rolled back; later hosts untouched),
         another run holds a host's lock (nothing was changed), or Ctrl-C (the host being
         deployed is reported interrupted; later hosts untouched)
      2  bad input (unknown host or service, --budget < 0, an api_key_file open to others);
         no host was touched
    """
    project = project_from(ctx)
    plan = plan_deploy(
        project,
        budget=budget,
        topk=topk,
        services=_names(services_, "--services"),
        hosts=split_names(hosts) or None,
        api_key=os.environ.get(API_KEY_ENV) or None,
    )
    for warning in plan.warnings:
        click.echo(f"warning: {warning}", err=True)
    seams = seams_from(ctx)
    try:
        with locked(ctx, [plan.project.host(h.host) for h in plan.hosts], "deploy", lock_timeout):
            report = execute_deploy(
                plan,
                progress=say,
                run_playbook=seams.run_playbook,
                unit_probe=systemd_unit_probe(plan.project, seams.transport),
                env_gate=stored_manifest_gate(plan.project, seams.transport),
            )
    except DeployInterrupted as interrupted:  # Ctrl-C: the report says where, and what converges it
        report = interrupted.report
    _render(ctx, report, f"deploy {report.deploy_id}", json_)


@click.command()
@click.option("--services", "services_", default=None, metavar="A,B", help="Only these services (default: all).")
@hosts_option
@lock_timeout_option
@json_option
@click.pass_context
def rollback(ctx, services_, hosts, lock_timeout, json_):
    """Point services back at their previous release and restart them, one host at a time.

    Services without a previous release (or not deployed) are left as they are: when that is
    every selected service, nothing was rolled back and the command fails saying why per service
    ("nothing to roll back: tree on gpu-1 has no previous release"); otherwise each is a warning.

    \b
    Examples:
      ddtree-ops rollback --hosts gpu-2
      ddtree-ops rollback --services tree --json

    \b
    Exit codes:
      0  every service with a previous release is back on it and healthy
      1  nothing to roll back, a host failed, a restored service is not healthy, or another run
         holds a host's lock (--lock-timeout; nothing was changed)
      2  bad input (unknown host or service); no host was touched
    """
    project = project_from(ctx)
    seams = seams_from(ctx)
    services, host_names = _names(services_, "--services"), split_names(hosts) or None
    with locked(ctx, project.select_hosts(host_names), "rollback", lock_timeout):
        report = execute_rollback(
            project,
            services=services,
            hosts=host_names,
            progress=say,
            run_playbook=seams.run_playbook,
            unit_probe=systemd_unit_probe(project, seams.transport),
        )
    _render(ctx, report, report.rollback_id, json_)


@click.command()
@click.option("--services", "services_", default=None, metavar="A,B", help="Only these services.")
@hosts_option
@click.option("--all", "all_", is_flag=True, help="Every service of the project file on every host.")
@click.option("--yes", "-y", "yes", is_flag=True, help="Do not ask for confirmation (scripts).")
@lock_timeout_option
@json_option
@click.pass_context
def undeploy(ctx, services_, hosts, all_, yes, lock_timeout, json_):
    """Stop, disable and remove services from hosts, one host at a time.

    Their releases stay on disk, and so do the engine env (or image) and the service's kernel
    cache (/var/cache/ddtree/<service>, reused if it is deployed again). A service no longer in
    the project file can be named with --services: it is removed wherever it is found. Without
    --services or --hosts it removes everything, so it needs --all, or a "y" at the prompt (on a
    terminal), or --yes. Running it again says there was nothing to remove.

    \b
    Examples:
      ddtree-ops undeploy --services tree
      ddtree-ops undeploy --all --json

    \b
    Exit codes:
      0  removed (or there was nothing to remove)
      1  a host failed (later hosts untouched), or another run holds a host's lock (nothing changed)
      2  bad input, or nothing selected and not confirmed (no --all, no --yes, no terminal)
    """
    if all_ and (services_ or hosts):
        raise ConfigError("--all removes every service on every host: leave out --services/--hosts, or leave out --all")
    project = project_from(ctx, api_key=False)  # undeploy stops and removes; it sends no request
    services, hosts = _names(services_, "--services"), split_names(hosts) or None
    pairs = plan_undeploy(project, services, hosts)  # unknown names: exit 2 before any question
    if not (all_ or services or hosts):
        _confirm_remove_everything(pairs, yes)
    with locked(ctx, [host for host, _names in pairs], "undeploy", lock_timeout):
        report = execute_undeploy(
            project, services=services, hosts=hosts, progress=say, run_playbook=seams_from(ctx).run_playbook,
        )  # fmt: skip
    if json_:
        emit_json(report.to_dict())
    else:
        for row in report.hosts:
            if row.status == "failed":
                click.echo(f"{row.host}: failed")
            elif row.status == "nothing to remove":
                click.echo(f"{row.host}: nothing to remove ({', '.join(row.services)} not deployed there)")
            else:
                click.echo(f"{row.host}: removed {', '.join(row.services)} (changed {row.changed})")
        if report.nothing_removed:
            click.echo("nothing to remove: no selected service was deployed on any selected host")
    if not report.ok:
        click.echo(f"error: {report.failure}", err=True)
        ctx.exit(1)


def stdin_is_interactive() -> bool:
    """Whether a person can answer a prompt (stdin is a terminal)."""
    return sys.stdin.isatty()


def _confirm_remove_everything(pairs, yes: bool) -> None:
    """Nothing selected means everything: ask on a terminal, else demand --all/--yes (exit 2)."""
    what = "; ".join(f"{host.name}: {', '.join(names)}" for host, names in pairs)
    if yes:
        return
    if not stdin_is_interactive():
        raise ConfigError(
            f"undeploy without --services or --hosts removes every service on every host ({what}); "
            "nothing was touched. Pass --all (or --yes) to remove them all, or name --services/--hosts"
        )
    if not click.confirm(f"Remove every service on every host ({what})?", default=False, err=True):
        raise ConfigError("undeploy cancelled: nothing was touched")
