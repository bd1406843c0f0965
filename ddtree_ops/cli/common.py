"""What every command shares: loading the project file, JSON output, errors to exit codes."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..config import Project, load_project
from ..exceptions import DdtreeOpsError
from ..hosts.ansible import run_playbook
from ..hosts.ssh import SSH, Transport


@contextmanager
def live_table(first: Table) -> Iterator[Callable[[Table], None]]:
    """The CLI's Ansible Display: the per-host progress table, redrawn in place on stderr."""
    with Live(first, console=Console(stderr=True), refresh_per_second=4, transient=False) as live:
        yield live.update


@dataclass(frozen=True)
class Seams:
    """The side effects every command hands to the library: the Ansible runner and the SSH transport.

    The real ones by default; a test passes its own through click's `obj`
    (`CliRunner().invoke(cli, args, obj={"seams": Seams(run_playbook=fake)})`).
    """

    run_playbook: Callable[..., Any] = field(default_factory=lambda: functools.partial(run_playbook, display=live_table))
    transport: Transport = SSH


def seams_from(ctx: click.Context) -> Seams:
    """The Seams of this invocation (the real ones unless a caller passed others)."""
    return (ctx.find_root().obj or {}).get("seams") or Seams()


def say(line: str) -> None:
    """The CLI's Progress: one line on stderr."""
    click.echo(line, err=True)


def project_from(ctx: click.Context) -> Project:
    """The validated project file for this invocation (raises ConfigError, exit 2)."""
    root = ctx.find_root()
    return load_project((root.obj or {}).get("config_path"))


def json_option(f):
    return click.option("json_", "--json", is_flag=True, help="Print one JSON document instead of a table.")(f)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


class DdtreeGroup(click.Group):
    """A click group that turns library exceptions into a message on stderr and their exit code.

    Doing it here (not in `main`) means CliRunner tests see the same exit codes as users.
    """

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except DdtreeOpsError as err:
            click.echo(f"error: {err}", err=True)
            ctx.exit(err.exit_code)
