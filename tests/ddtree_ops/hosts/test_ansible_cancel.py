"""Ctrl-C during a playbook cancels it: ansible-playbook is killed before `run_playbook` raises
KeyboardInterrupt, so it starts no further task after ddtree-ops stopped. The task already running
may still finish (Ansible runs it in a worker of its own session, as it would on a remote host).

A real ansible-playbook run (connection local: a task that sleeps, then one that would write a
file), and a real SIGINT to this process.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from ddtree_ops.config import parse_project
from ddtree_ops.hosts.ansible import run_playbook

# The sleep's argument, unique to this run: finds its process in /proc.
MARKER = f"{60 + (os.getpid() * 7919 + time.time_ns()) % 9973 / 10000:.4f}"


def _processes(match) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
            zombie = "State:\tZ" in (cmdline.parent / "status").read_text()
        except OSError:
            continue
        if match(argv) and not zombie:
            found.append(int(cmdline.parent.name))
    return found


def _sleeps() -> list[int]:
    return _processes(lambda argv: argv[:1] == ["sleep"] and MARKER in argv)


def test_sigint_cancels_the_running_playbook_then_raises_keyboardinterrupt(tmp_path):
    after = tmp_path / "second-task-ran"
    playbook = tmp_path / "sleep.yml"
    playbook.write_text(
        "- hosts: ddtree\n  connection: local\n  gather_facts: false\n  tasks:\n"
        f"    - name: Sleep\n      ansible.builtin.command: sleep {MARKER}\n"
        f"    - name: Write a file\n      ansible.builtin.command: touch {after}\n"
    )
    project = parse_project({
        "hosts": [{"name": "here", "address": "127.0.0.1"}],
        "engine": {"target": "lab", "draft": "lab"},
        "services": [{"name": "baseline", "algorithm": "dflash", "port": 30000}],
    })  # fmt: skip

    def interrupt_once_sleeping() -> None:
        deadline = time.monotonic() + 60
        while not _sleeps() and time.monotonic() < deadline:
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)
    threading.Thread(target=interrupt_once_sleeping, daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt, match="sleep.yml was cancelled"):
            run_playbook(str(playbook), project, project.hosts, {}, log_dir=tmp_path)
        assert time.monotonic() - started < 45, "the playbook ran to its end instead of being cancelled"
        assert signal.getsignal(signal.SIGINT) is before, "run_playbook must put the previous SIGINT handler back"
    finally:
        for pid in _sleeps():  # the running task, started by this test's playbook: end it now
            os.kill(pid, signal.SIGTERM)
    # With the running task over, nothing of that playbook is left, and its next task never ran.
    deadline = time.monotonic() + 20
    while _processes(lambda argv: str(playbook) in argv) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes(lambda argv: str(playbook) in argv) == [], "ansible-playbook is still running after the cancel"
    assert not after.exists(), "the cancelled playbook went on to its next task"
