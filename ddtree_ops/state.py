"""Where ddtree-ops keeps its own files on the control node (XDG layout, overridable for tests).

- state: logs of every Ansible run, the SSH known_hosts of hosts made outside a project file
  (`$DDTREE_STATE_DIR`, else ~/.local/state/ddtree-ops)
- cache: wheelhouses and the lab's root filesystem (`$DDTREE_CACHE_DIR`, else ~/.cache/ddtree-ops)
"""

from __future__ import annotations

import os
from pathlib import Path


def _xdg(env: str, xdg_env: str, fallback: str) -> Path:
    if os.environ.get(env):
        return Path(os.environ[env])
    base = os.environ.get(xdg_env) or str(Path.home() / fallback)
    return Path(base) / "ddtree-ops"


def state_dir() -> Path:
    return _xdg("DDTREE_STATE_DIR", "XDG_STATE_HOME", ".local/state")


def cache_dir() -> Path:
    return _xdg("DDTREE_CACHE_DIR", "XDG_CACHE_HOME", ".cache")


def log_dir() -> Path:
    """Full logs of Ansible runs, one file per run."""
    return state_dir() / "logs"


def known_hosts_file() -> Path:
    """The known_hosts of a Host made outside a project file (a project's hosts use the project's: `Host.known_hosts`)."""
    return state_dir() / "known_hosts"


def repo_root() -> Path:
    """The checkout this package runs from: ansible/ and docker/ live beside ddtree_ops/."""
    return Path(__file__).resolve().parent.parent
