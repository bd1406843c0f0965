"""`ddtree-ops lab up | down | status`: the local fleet of Docker hosts."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from .. import lab as lab_fleet
from .common import emit_json, json_option

_dir_option = click.option(
    "--dir",
    "lab_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Lab directory (SSH key, ddtree.yaml). Default: $DDTREE_LAB_DIR, else ~/.local/share/ddtree-ops/lab.",
)


@click.group()
def lab() -> None:
    """A local fleet of Docker hosts running systemd and sshd."""


def _render(report: lab_fleet.LabReport) -> None:
    table = Table(title=f"lab ({report.image})", title_justify="left")
    for column in ("host", "container", "address", "docker", "systemd", "ssh"):
        table.add_column(column)
    for h in report.hosts:
        systemd = h.systemd if h.systemd in ("running", "-") else f"[yellow]{h.systemd}[/yellow]"
        table.add_row(h.name, h.container, h.address or "-", h.state, systemd, "yes" if h.ssh else "[red]no[/red]")
    console = Console()
    console.print(table)
    if not report.hosts:
        console.print("no lab hosts; start them with `ddtree-ops lab up`")


@lab.command()
@click.option("--hosts", "n_hosts", type=click.IntRange(1, 16), default=2, show_default=True, help="How many hosts.")
@_dir_option
@json_option
def up(n_hosts: int, lab_dir: Path | None, json_: bool) -> None:
    """Start (or reuse) lab-1..lab-N and write the lab's ddtree.yaml."""
    report = lab_fleet.up(n_hosts, lab_dir)
    if json_:
        emit_json(report.to_dict())
        return
    _render(report)
    click.echo(f"project file: {report.config_path}")
    click.echo(f"use it with:  export DDTREE_CONFIG={report.config_path}")
    click.echo("timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in report.timings_s.items()), err=True)


@lab.command()
@_dir_option
@json_option
def status(lab_dir: Path | None, json_: bool) -> None:
    """Each lab host: container, address, systemd state, SSH reachability."""
    report = lab_fleet.status(lab_dir)
    if json_:
        emit_json(report.to_dict())
        return
    _render(report)
    if report.config_path:
        click.echo(f"project file: {report.config_path}")


@lab.command()
@_dir_option
@json_option
def down(lab_dir: Path | None, json_: bool) -> None:
    """Remove the lab's containers, network and directory (the image stays cached)."""
    removed = lab_fleet.down(lab_dir)
    if json_:
        emit_json({"removed": removed})
        return
    click.echo("removed: " + (", ".join(removed) if removed else "nothing (no lab was running)"))
