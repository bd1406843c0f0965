"""The `ddtree-ops` command: thin click commands that parse, call a library function, and render.

Commands are registered here, explicitly: a command module that is missing or broken fails the
import of the CLI (and so every test), instead of silently dropping its command.
"""

from __future__ import annotations

import logging
import sys

import click

from . import compare, deploy, doctor, health, init_cmd, lab, provision
from .common import DdtreeGroup

COMMANDS: tuple[click.Command, ...] = (
    init_cmd.init,
    lab.lab,
    provision.provision,
    deploy.deploy,
    deploy.rollback,
    deploy.undeploy,
    health.healthcheck,
    compare.compare,
    doctor.doctor,
)


@click.group(cls=DdtreeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Project file (default: $DDTREE_CONFIG, else ./ddtree.yaml).",
)
@click.version_option(package_name="ddtree-ops")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None) -> None:
    """Provision, deploy, health-check and compare DDTree speculative decoding on GPU hosts."""
    # `obj` may arrive with seams (tests: `CliRunner().invoke(cli, args, obj={"seams": Seams(...)})`).
    ctx.ensure_object(dict)["config_path"] = config_path


for _command in COMMANDS:
    cli.add_command(_command)


def _log_to_stderr() -> None:
    """Library code logs through `logging`; the CLI shows INFO and above on stderr, as plain lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("ddtree_ops")
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def main() -> None:
    _log_to_stderr()
    cli()
