"""`ddtree-ops doctor [--hosts H1,H2] [--json]`: the preflight, one line per check."""

from __future__ import annotations

import click

from ..health import doctor as doctoring
from .common import emit_json, hosts_from, hosts_option, json_option, positional_hosts_argument, project_from, say, seams_from


@click.command(
    epilog="""\b
Examples:
  ddtree-ops doctor                              # this machine and every host
  ddtree-ops doctor --hosts gpu-1,gpu-2          # only these hosts
  ddtree-ops doctor -c prod.yaml --no-manifest   # skip importing torch/sglang in each env
  ddtree-ops doctor --json | jq '.checks[] | select(.status != "ok")'

\b
Exit codes:
  0  nothing failed (warnings allowed: read the WARN lines)
  1  a check failed
  2  bad input (project file, unknown host): nothing was checked
"""
)
@hosts_option
@positional_hosts_argument
@click.option("--container/--no-container", "container_mode", default=None, help="Check Docker too (default: when engine.install.mode is container).")
@click.option("--connect-timeout", "connect_timeout_s", type=click.IntRange(1, 120), default=5, show_default=True, help="SSH connect timeout per host, seconds (hosts are checked in parallel).")
@click.option("--no-manifest", is_flag=True, help="Skip running the ABI manifest in each host's env (it imports torch/sglang there).")
@json_option
@click.pass_context
def doctor(
    ctx: click.Context,
    hosts: tuple[str, ...],
    positional_hosts: tuple[str, ...],
    container_mode: bool | None,
    connect_timeout_s: int,
    no_manifest: bool,
    json_: bool,
) -> None:
    """Check this machine and each host: tools, SSH, probe, lock, ABI manifest, drift.

    Hosts are checked in parallel; each one's progress goes to stderr as it finishes.
    """
    project = project_from(ctx, api_key=False)  # doctor sends no request to the services
    # unknown names: ConfigError (exit 2) before any host is touched
    selected = project.select_hosts(hosts_from("doctor", hosts, positional_hosts))
    report = doctoring.run_doctor(
        project, selected, container_mode, connect_timeout_s, run_manifest=not no_manifest,
        transport=seams_from(ctx).transport, progress=say,
    )  # fmt: skip
    if json_:
        emit_json(report.to_dict())
    else:
        for line in report.lines():
            click.echo(line)
        click.echo(summary(report), err=True)
    ctx.exit(report.exit_code)


def summary(report: doctoring.DoctorReport) -> str:
    """The last line: failures first, then warnings; "all checks passed" only when there is neither."""
    failed = sum(c.status == "fail" for c in report.checks)
    warned = sum(c.status == "warn" for c in report.checks)
    if failed:
        return f"doctor: {failed} check(s) failed" + (f", {warned} warning(s)" if warned else "")
    if warned:
        return f"doctor: passed with {warned} warning(s): read the WARN lines"
    return "doctor: all checks passed"
