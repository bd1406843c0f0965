"""What every command shares: loading the project file, JSON output, errors to exit codes."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..config import CONFIG_ENV, DEFAULT_CONFIG_NAME, Project, load_project
from ..exceptions import ConfigError, DdtreeOpsError
from ..hosts.ansible import run_playbook
from ..hosts.ssh import SSH, Transport
from ..lab.identity import CONFIG_NAME, MARKER, default_lab_dir


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


def project_path(explicit: str | None) -> Path:
    """Which project file this invocation reads: `-c`, else `$DDTREE_CONFIG`, else `./ddtree.yaml`,
    else the default lab's (what `ddtree-ops lab up` wrote; a note on stderr says so).

    The lab's file is the last resort only: a real project (`-c`, `$DDTREE_CONFIG`, `./ddtree.yaml`)
    always wins, and the fallback can only ever point at local lab containers.

    Args:
        explicit: the `-c/--config` value, if given.

    Returns:
        The path to load (it exists unless `-c` or `$DDTREE_CONFIG` named a missing file).

    Raises:
        ConfigError: none of them exists; the message gives the exact `export DDTREE_CONFIG=…` line.
    """
    if explicit:
        return Path(explicit)
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    local = Path(DEFAULT_CONFIG_NAME)
    if local.exists():
        return local
    lab_dir = default_lab_dir().expanduser()
    lab_config = lab_dir / CONFIG_NAME
    if lab_config.exists() and (lab_dir / MARKER).exists():
        note = f"using the lab's project file {lab_config} (no -c, no ${CONFIG_ENV}, no ./{DEFAULT_CONFIG_NAME})"
        click.echo(note, err=True)
        return lab_config
    raise ConfigError(
        f"no project file: no -c PATH, no ${CONFIG_ENV}, no ./{DEFAULT_CONFIG_NAME} and no lab's at {lab_config}. "
        f"Name one with `export {CONFIG_ENV}=/path/to/ddtree.yaml` (a lab made with `lab up --dir DIR`: "
        f"`export {CONFIG_ENV}=DIR/{CONFIG_NAME}`), write one with `ddtree-ops init`, or start the default "
        "lab with `ddtree-ops lab up` (then commands find its file)"
    )


def project_from(ctx: click.Context) -> Project:
    """The validated project file for this invocation (raises ConfigError, exit 2); see `project_path`."""
    root = ctx.find_root()
    return load_project(project_path((root.obj or {}).get("config_path")))


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
