"""`ddtree-ops doctor [HOST…] [--json]`: the preflight, one line per check."""

from __future__ import annotations

import click

from ..health import doctor as doctoring
from .common import emit_json, json_option, project_from, seams_from


@click.command()
@click.argument("host_names", metavar="[HOST]...", nargs=-1)
@click.option("--container/--no-container", "container_mode", default=None, help="Check Docker too (default: when engine.install.mode is container).")
@click.option("--connect-timeout", "connect_timeout_s", type=click.IntRange(1, 120), default=5, show_default=True, help="SSH connect timeout per host, seconds.")
@click.option("--no-manifest", is_flag=True, help="Skip running the ABI manifest in each host's env (it imports torch/sglang there).")
@json_option
@click.pass_context
def doctor(ctx: click.Context, host_names: tuple[str, ...], container_mode: bool | None, connect_timeout_s: int, no_manifest: bool, json_: bool) -> None:
    """Check this machine and each host: tools, SSH, probe, lock, ABI manifest, drift.

    Exit 0 when nothing failed (warnings allowed), 1 when a check failed, 2 on bad input.
    """
    project = project_from(ctx)
    hosts = project.select_hosts(host_names)  # unknown names: ConfigError (exit 2) before any host is touched
    report = doctoring.run_doctor(
        project, hosts, container_mode, connect_timeout_s, run_manifest=not no_manifest, transport=seams_from(ctx).transport
    )
    if json_:
        emit_json(report.to_dict())
    else:
        for line in report.lines():
            click.echo(line)
        failed = sum(c.status == "fail" for c in report.checks)
        click.echo("doctor: all checks passed" if report.ok else f"doctor: {failed} check(s) failed", err=True)
    ctx.exit(report.exit_code)
