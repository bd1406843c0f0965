"""`ddtree-ops lab up | down | status`: the local fleet of Docker hosts, one lab per directory."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from .. import lab as lab_fleet
from .common import InOrderGroup, emit_json, json_option

_dir_option = click.option(
    "--dir",
    "lab_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Lab directory (SSH key, ddtree.yaml); it names the lab, whose Docker objects are "
    "ddtree-lab-<id>-N. Default: $DDTREE_LAB_DIR, else ~/.local/share/ddtree-ops/lab.",
)


_LAB_EXIT_CODES = """\b
Exit codes:
  0  done
  1  Docker failed or is missing, a host did not boot or answer SSH, or a name is another lab's
  2  bad input (--hosts out of range)
"""


@click.group(
    cls=InOrderGroup,
    epilog="""\b
Examples:
  ddtree-ops lab up                   # lab-1, lab-2 in the default lab directory
  ddtree-ops lab up --hosts 3 --dir ./.lab
  ddtree-ops lab status --dir ./.lab
  ddtree-ops lab down --dir ./.lab

"""
    + _LAB_EXIT_CODES
)
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


def _lab_document(report) -> dict:
    """The `--json` document of `lab up|status|down` in the common envelope (schemas/lab-*.json):
    `ok` is true (a lab command that fails raises, exit 1/2), hosts[] entries also say `host`."""
    doc = report.to_dict()
    if "hosts" in doc:
        doc["hosts"] = [{"host": h["name"], **h} for h in doc["hosts"]]
    return {"ok": True, **doc}


def _is_default_dir(lab_dir: str) -> bool:
    return Path(lab_dir) == lab_fleet.default_lab_dir().expanduser().resolve()


@lab.command(
    epilog="""\b
Examples:
  ddtree-ops lab up                        # 2 hosts; then plain `ddtree-ops provision` finds the lab
  ddtree-ops lab up --hosts 3 --dir ./.lab
  ddtree-ops lab up --json | jq .config_path

"""
    + _LAB_EXIT_CODES
)
@click.option("--hosts", "n_hosts", type=click.IntRange(1, 16), default=2, show_default=True, help="How many hosts.")
@_dir_option
@json_option
def up(n_hosts: int, lab_dir: Path | None, json_: bool) -> None:
    """Start (or reuse) this lab's lab-1..lab-N and write the lab's ddtree.yaml."""
    report = lab_fleet.up(n_hosts, lab_dir)
    _warn(report.warnings)
    if json_:
        emit_json(_lab_document(report))
        return
    _render(report)
    click.echo(f"project file: {report.config_path}")
    click.echo(f"use it with:  export DDTREE_CONFIG={report.config_path}")
    if _is_default_dir(report.lab_dir):
        click.echo("next:         ddtree-ops provision   "
                   "(finds this file when there is no -c, $DDTREE_CONFIG or ./ddtree.yaml)")
    else:
        click.echo(f"next:         ddtree-ops -c {report.config_path} provision")
    click.echo("then:         ddtree-ops deploy, ddtree-ops healthcheck, ddtree-ops compare")
    click.echo("timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in report.timings_s.items()), err=True)


@lab.command(
    epilog="""\b
Examples:
  ddtree-ops lab status
  ddtree-ops lab status --dir ./.lab --json

"""
    + _LAB_EXIT_CODES
)
@_dir_option
@json_option
def status(lab_dir: Path | None, json_: bool) -> None:
    """This lab's hosts: container, address, systemd state, SSH reachability (never another lab's)."""
    report = lab_fleet.status(lab_dir)
    _warn(report.warnings)
    if json_:
        emit_json(_lab_document(report))
        return
    _render(report)
    if report.config_path:
        click.echo(f"project file: {report.config_path}")


@lab.command(
    epilog="""\b
Examples:
  ddtree-ops lab down
  ddtree-ops lab down --dir ./.lab --json

"""
    + _LAB_EXIT_CODES
)
@_dir_option
@json_option
def down(lab_dir: Path | None, json_: bool) -> None:
    """Remove this lab's containers, volumes, network and directory (the image stays cached)."""
    # Stopping systemd containers takes seconds each: say so first, so the wait is not silent.
    click.echo(f"lab down: removing the lab in {lab_dir or lab_fleet.default_lab_dir()} (containers stop in a few seconds each)", err=True)
    started = time.monotonic()
    report = lab_fleet.down(lab_dir)
    click.echo(f"lab down: done in {time.monotonic() - started:.1f}s", err=True)
    _warn(report.warnings)
    if json_:
        emit_json(_lab_document(report))
        return
    if report.removed:
        click.echo("removed: " + ", ".join(report.removed))
    else:
        click.echo(f"removed: nothing (no lab in {report.lab_dir})")
