"""`ddtree-ops init [PATH]`: write an annotated example project file."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import click
import yaml

from ..config import DEFAULT_CONFIG_NAME, parse_project
from ..exceptions import ConfigError
from .common import CONFIG_KEY, config_option


def example_project_text() -> str:
    """The annotated example ddtree.yaml (it passes validation: tests check that)."""
    return resources.files("ddtree_ops.templates").joinpath("ddtree.example.yaml").read_text()


def write_example(path: Path, force: bool = False) -> Path:
    """Write the example to `path`. Raises ConfigError (exit 2) if it exists and `force` is not set."""
    if path.exists() and not force:
        raise ConfigError(f"{path} already exists; pass --force to overwrite it")
    text = example_project_text()
    parse_project(yaml.safe_load(text), "the example project file")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@click.command(
    "init",
    epilog="""\b
Examples:
  ddtree-ops init                     # ./ddtree.yaml
  ddtree-ops init prod.yaml           # or: ddtree-ops init -c prod.yaml
  ddtree-ops init ddtree.yaml --force # overwrite an existing file

\b
Exit codes:
  0  written
  2  the file exists (pass --force), or PATH and -c name different files
""",
)
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path), required=False)
@config_option
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
@click.pass_context
def init(ctx: click.Context, path: Path | None, force: bool) -> None:
    """Write an annotated example project file to PATH (default: -c FILE, else ./ddtree.yaml)."""
    config = ctx.find_root().meta.get(CONFIG_KEY)
    if path is not None and config is not None and Path(config) != path:
        raise click.UsageError(f"PATH {path} and -c {config} name different files: give one")
    path = path or Path(config or DEFAULT_CONFIG_NAME)
    write_example(path, force)
    click.echo(f"wrote {path}; edit its hosts (and services), then:")
    use = "" if path == Path(DEFAULT_CONFIG_NAME) else f" -c {path}"
    click.echo(f"  ddtree-ops{use} doctor            # this machine and each host: SSH, probe, lock")
    click.echo(f"  ddtree-ops{use} provision --plan  # the lock each host would get; changes nothing")
    click.echo(f"  ddtree-ops{use} provision         # build the engine env on every host")
