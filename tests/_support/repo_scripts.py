"""Load a repository script (benchmarks/, training/: folders of scripts, not packages) by its path."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load_script(relative_path: str, name: str) -> ModuleType:
    """The module at REPO / `relative_path`, executed once more under `name` (not put in sys.modules).

    Args:
        relative_path: the script's path from the repository root, e.g. "benchmarks/bench_tree_step.py".
        name: the module's name while it runs.

    Returns:
        The executed module.
    """
    spec = importlib.util.spec_from_file_location(name, REPO / relative_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
