"""`ddtree-ops lab up | down | status`: the local fleet of Docker hosts, one lab per directory."""

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
    help="Lab directory (SSH key, ddtree.yaml); it names the lab, whose Docker objects are "
    "ddtree-lab-<id>-N. Default: $DDTREE_LAB_DIR, else ~/.local/share/ddtree-ops/lab.",
)


@click.group()
def lab() -> None:
    """A local fleet of Docker hosts running systemd and sshd; one lab per directory.

    A lab owns only the containers, network and volumes named after its directory's id
    (`ddtree-lab-<id>-N`, labelled ddtree.lab.id=<id>); up, down and status never touch another's.
    """


def _warn(warnings: list[str]) -> None:
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)


def _render(report: lab_fleet.LabReport) -> None:
    console = Console()
    if not report.hosts:
        console.print(f"no lab in {report.lab_dir} (lab id {report.lab_id}); start one with "
                      f"`ddtree-ops lab up --dir {report.lab_dir}`", soft_wrap=True)  # fmt: skip
        if report.other_labs:
            console.print("other labs on this Docker daemon (see `ddtree-ops lab status --dir DIR`): "
                          + ", ".join(report.other_labs), soft_wrap=True)  # fmt: skip
        return
    table = Table(title=f"lab {report.lab_id} in {report.lab_dir} ({report.image})", title_justify="left")
    for column in ("host", "container", "address", "docker", "systemd", "ssh"):
        table.add_column(column)
    for h in report.hosts:
        systemd = h.systemd if h.systemd in ("running", "-") else f"[yellow]{h.systemd}[/yellow]"
        table.add_row(h.name, h.container, h.address or "-", h.state, systemd, "yes" if h.ssh else "[red]no[/red]")
    console.print(table)


def _is_default_dir(lab_dir: str) -> bool:
    return Path(lab_dir) == lab_fleet.default_lab_dir().expanduser().resolve()


@lab.command()
@click.option("--hosts", "n_hosts", type=click.IntRange(1, 16), default=2, show_default=True, help="How many hosts.")
@_dir_option
@json_option
def up(n_hosts: int, lab_dir: Path | None, json_: bool) -> None:
    """Start (or reuse) this lab's lab-1..lab-N and write the lab's ddtree.yaml."""
    report = lab_fleet.up(n_hosts, lab_dir)
    _warn(report.warnings)
    if json_:
        emit_json(report.to_dict())
        return
    _render(report)
    click.echo(f"project file: {report.config_path}")
    click.echo(f"use it with:  export DDTREE_CONFIG={report.config_path}")
    if _is_default_dir(report.lab_dir):
        click.echo("next:         ddtree-ops provision   "
                   "(finds this file when there is no -c, $DDTREE_CONFIG or ./ddtree.yaml)")
    click.echo("timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in report.timings_s.items()), err=True)


@lab.command()
@_dir_option
@json_option
def status(lab_dir: Path | None, json_: bool) -> None:
    """This lab's hosts: container, address, systemd state, SSH reachability (never another lab's)."""
    report = lab_fleet.status(lab_dir)
    _warn(report.warnings)
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
    """Remove this lab's containers, volumes, network and directory (the image stays cached)."""
    report = lab_fleet.down(lab_dir)
    _warn(report.warnings)
    if json_:
        emit_json(report.to_dict())
        return
    if report.removed:
        click.echo("removed: " + ", ".join(report.removed))
    else:
        click.echo(f"removed: nothing (no lab in {report.lab_dir})")
