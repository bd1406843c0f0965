"""What every command shares: loading the project file, JSON output, errors to exit codes."""

from __future__ import annotations

import json
from typing import Any

import click

from ..config import Project, load_project
from ..exceptions import DdtreeOpsError


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
