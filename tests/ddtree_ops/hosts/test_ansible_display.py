"""The one Ansible runner draws nothing itself: progress tables go to the Display it is given (the CLI's
draws them on stderr). A real ansible-playbook run against a host that does not answer."""

from __future__ import annotations

import socket
from contextlib import contextmanager

import pytest

from ddtree_ops.config import parse_project
from ddtree_ops.exceptions import HostError
from ddtree_ops.hosts.ansible import run_playbook


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_progress_tables_go_to_the_display_and_nothing_is_printed(tmp_path, capfd):
    project = parse_project(
        {
            "hosts": [{"name": "gone", "address": "127.0.0.1", "ssh": {"port": _closed_port()}}],
            "engine": {"target": "lab", "draft": "lab"},
            "services": [{"name": "baseline", "algorithm": "dflash", "port": 30000}],
        },
        "test",
    )
    shown = []

    @contextmanager
    def recorder(first):
        shown.append(first)
        yield shown.append

    with pytest.raises(HostError, match="host gone .* is unreachable over SSH"):
        run_playbook("facts.yml", project, project.hosts, {}, log_dir=tmp_path, display=recorder)
    assert shown and shown[0].title == "ansible: facts.yml on 1 host(s)"
    last_row = [column._cells[0] for column in shown[-1].columns]
    assert last_row[0] == "gone" and "unreachable" in last_row[1]
    out, err = capfd.readouterr()
    assert out == "" and "ansible:" not in err, "the library drew the table itself"
