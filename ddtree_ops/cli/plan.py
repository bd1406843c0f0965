"""`provision --plan [--facts FILE] [--gpu-arch SM] [--json]`: options and handler for the provision command.

Not a command of its own: `cli/provision.py` adds `@plan_options` to `provision` and calls
`handle_plan(...)` first; when it returns True the plan was printed and nothing else may run.
"""

from __future__ import annotations

import click

from ..config import Host, Project
from ..hosts.ssh import SSH, Transport
from ..progress import Progress, silent
from ..provision import plan as planning
from .common import emit_json, next_step


def plan_options(f):
    f = click.option(
        "gpu_archs",
        "--gpu-arch",
        multiple=True,
        help="With --plan: plan for this GPU architecture (sm_90, sm_120) when the facts show no GPU.",
    )(f)
    f = click.option(
        "facts_file",
        "--facts",
        type=click.Path(dir_okay=False),
        default=None,
        help="With --plan and one --hosts name: a recorded probe (host_scripts/probe.py output) instead of probing the host.",
    )(f)
    f = click.option("plan", "--plan", is_flag=True, help="Print the lock each host would get, or why not; change nothing.")(f)
    return f


def handle_plan(
    ctx: click.Context,
    project: Project,
    hosts: list[Host],
    plan: bool,
    facts_file: str | None,
    gpu_archs: tuple[str, ...],
    json_: bool,
    connect_timeout_s: int = planning.DEFAULT_CONNECT_TIMEOUT_S,
    transport: Transport = SSH,
    progress: Progress = silent,
) -> bool:
    """Print the plan and exit (0 every host has a lock, 1 one is refused or unreachable) when --plan is set.

    Hosts are probed in parallel with `connect_timeout_s`; `progress` hears each one finish.
    Returns False (and does nothing) without --plan; --facts/--gpu-arch without --plan are usage errors.
    """
    if not plan:
        if facts_file or gpu_archs:
            raise click.UsageError("--facts and --gpu-arch only apply with --plan")
        return False
    results = planning.plan_hosts(
        project, hosts, facts_file, tuple(gpu_archs), connect_timeout_s=connect_timeout_s, transport=transport, progress=progress
    )
    if json_:
        emit_json(planning.plan_document(results))
    else:
        click.echo(planning.render_side_by_side(results))
        if planning.plan_exit_code(results) == 0:
            only = f" --hosts {','.join(h.name for h in hosts)}" if len(hosts) < len(project.hosts) else ""
            next_step(ctx, f"ddtree-ops provision{only}", "builds these locks; a host already on its lock is left alone")
    ctx.exit(planning.plan_exit_code(results))
    return True
