"""Output that does not mislead when it is piped: no 80-column cut, and stderr's progress table ends
its own line before the next progress line."""

from __future__ import annotations

import io
import sys

from rich.table import Table

from ddtree_ops.cli.common import live_table, say
from ddtree_ops.cli.render import console


def _table(task: str) -> Table:
    table = Table(title="ansible deploy.yml")
    table.add_column("host")
    table.add_column("task")
    table.add_row("lab-1", task)
    return table


def test_the_progress_table_on_a_piped_stderr_ends_before_the_next_line(monkeypatch):
    stderr = io.StringIO()  # not a terminal, like `2> log` or a pipe
    monkeypatch.setattr(sys, "stderr", stderr)
    with live_table(_table("starting")) as show:
        show(_table("Install the unit of tree"))
    say("lab-1: waiting up to 900s for /health of each service")
    lines = stderr.getvalue().splitlines()
    assert lines[-1] == "lab-1: waiting up to 900s for /health of each service"
    assert lines[-2].startswith("└") and lines[-2].endswith("┘"), lines[-2]


def test_tables_on_a_piped_stdout_are_not_cut_to_80_columns(monkeypatch):
    stdout = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stdout)
    release = "20260102T030405123Z-tree-0123456789abcdef0123456789abcdef"
    table = Table(title="deploy")
    for column in ("host", "service", "release", "detail"):
        table.add_column(column)
    table.add_row("gpu-1", "tree", release, "/opt/ddtree/envs/0123456789abcdef/bin/ddtree-engine " * 2)
    console().print(table)
    text = stdout.getvalue()
    assert release in text and "…" not in text
    assert max(len(line) for line in text.splitlines()) > 150
