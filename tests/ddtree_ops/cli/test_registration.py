"""Commands are registered explicitly: every one is there, and a missing command module fails loudly."""

from __future__ import annotations

import subprocess
import sys

from ddtree_ops.cli import cli

COMMANDS = {"init", "lab", "hosts", "provision", "deploy", "rollback", "undeploy", "healthcheck", "compare", "sweep", "doctor"}


def test_every_command_is_registered():
    assert set(cli.commands) == COMMANDS
    assert set(cli.commands["lab"].commands) == {"up", "down", "status"}
    assert set(cli.commands["hosts"].commands) == {"trust"}


def test_a_missing_command_module_breaks_the_import_instead_of_dropping_the_command():
    # Hide one command module from the import system, as a packaging mistake would.
    code = (
        "import sys, importlib.abc\n"
        "class Hide(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ddtree_ops.cli.compare':\n"
        "            raise ModuleNotFoundError(name=name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "import ddtree_ops.cli\n"
        "print(sorted(ddtree_ops.cli.cli.commands))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, f"the CLI imported without its compare command: {proc.stdout}"
    assert "ImportError: cannot import name 'compare'" in proc.stderr, proc.stderr[-500:]
