"""The `ddtree-ops` command: thin click commands that parse, call a library function, and render."""

from __future__ import annotations

import click

from .common import DdtreeGroup


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
    ctx.obj = {"config_path": config_path}


def _register() -> None:
    # Each command group lives in its own module; importing it attaches it to `cli`.
    import importlib

    for name in ("init_cmd", "lab", "provision", "deploy", "health", "compare", "doctor"):
        try:
            importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise


_register()


def main() -> None:
    cli()
