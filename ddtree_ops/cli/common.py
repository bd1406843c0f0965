"""What every command shares: loading the project file, JSON output, errors to exit codes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from ..config import CONFIG_ENV, DEFAULT_CONFIG_NAME, Project, load_project
from ..exceptions import ConfigError, DdtreeOpsError


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
    from ..lab.fleet import CONFIG_NAME, MARKER, default_lab_dir

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
