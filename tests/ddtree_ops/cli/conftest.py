"""Fixtures for the CLI tests: an isolated working directory, project files, and hosts that never answer.

Every host these tests reach is on 127.0.0.1 (a closed port, or a listening socket that never
answers SSH): nothing leaves this machine.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from ddtree_ops.cli import cli
from ddtree_ops.lab.identity import LAB_DIR_ENV


def run_cli(*args: str) -> Result:
    """Run the real CLI in-process, exceptions propagating (a crash is a failure, not an exit code)."""
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, prog_name="ddtree-ops")


def make_project_doc(hosts: dict[str, int], **overrides) -> dict:
    """A valid project: each host on 127.0.0.1 at the given SSH port, a baseline and a tree service."""
    doc = {
        "version": 1,
        "hosts": [{"name": name, "address": "127.0.0.1", "ssh": {"port": port}} for name, port in hosts.items()],
        "engine": {"backend": "reference", "target": "lab", "draft": "lab"},
        "services": [
            {"name": "baseline", "algorithm": "dflash", "port": 30000},
            {"name": "tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "port": 30001},
        ],
    }
    doc.update(overrides)
    return doc


@pytest.fixture
def places(tmp_path, monkeypatch) -> Path:
    """An empty working directory, no $DDTREE_CONFIG, and a default lab directory with no lab in it:
    a command finds a project file only where the test puts one."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("DDTREE_CONFIG", raising=False)
    monkeypatch.setenv(LAB_DIR_ENV, str(tmp_path / "no-lab"))
    return cwd


@pytest.fixture
def write_project(tmp_path) -> Callable[..., Path]:
    """write_project(doc or text, name="p.yaml") -> the file's path (outside the working directory)."""

    def write(doc: dict | str, name: str = "p.yaml") -> Path:
        path = tmp_path / "projects" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
        return path

    return write


@pytest.fixture
def silent_ports() -> Iterator[Callable[[], int]]:
    """silent_port() -> a port on 127.0.0.1 that accepts TCP connections and never says a word, so an
    SSH client waits for the server's banner until its ConnectTimeout ends the attempt."""
    sockets: list[socket.socket] = []

    def open_one() -> int:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        s.listen(16)  # the kernel completes the handshake; nobody ever accepts or writes
        sockets.append(s)
        return s.getsockname()[1]

    yield open_one
    for s in sockets:
        s.close()


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def invoke() -> Callable[..., Result]:
    """invoke(*args) -> the Result of `ddtree-ops ARGS` run in-process with catch_exceptions=False."""
    return run_cli


@pytest.fixture
def project_doc() -> Callable[..., dict]:
    """project_doc({"h1": ssh_port, ...}, **top_level_overrides) -> a valid project document."""
    return make_project_doc


@pytest.fixture
def closed_port() -> Callable[[], int]:
    """closed_port() -> a port on 127.0.0.1 with nothing listening (connections are refused at once)."""
    return _closed_port
