"""`ddtree-ops init [PATH]`: write an annotated example project file."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import click
import yaml

from ..config import DEFAULT_CONFIG_NAME, parse_project
from ..exceptions import ConfigError


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


@click.command("init")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path), default=DEFAULT_CONFIG_NAME)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def init(path: Path, force: bool) -> None:
    """Write an annotated example project file to PATH (default ./ddtree.yaml)."""
    write_example(path, force)
    click.echo(f"wrote {path}; edit the hosts, then run `ddtree-ops -c {path} provision`")
