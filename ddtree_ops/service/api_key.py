"""Where the services' API key comes from, checked before any host is touched.

The key lives in two places only: the caller's environment (or a 0600 file the project file names) on
the control node, and `/etc/ddtree/<service>.env` (0600, root) on each host. `ddtree.yaml` names its
source, never the key: `api_key_env: NAME` (the caller's `$NAME`) or `api_key_file: PATH` (relative to
the project file's folder; owned by the caller, no group or other permission bits). Neither: the
caller's `$DDTREE_API_KEY`, if set. The client (`client.api_headers`) reads `$DDTREE_API_KEY`, so the
CLI puts the resolved key there for its own process (`export_api_key`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..config import Project
from ..exceptions import ConfigError

API_KEY_ENV = "DDTREE_API_KEY"


def resolve_api_key(project: Project, project_dir: str | os.PathLike = ".") -> str | None:
    """The API key the project file points at (None: no key anywhere).

    Args:
        project: the validated project file (its `api_key_env` / `api_key_file`).
        project_dir: the folder `api_key_file` is relative to (the project file's).
    Returns:
        the key, or None when the project names no source and `$DDTREE_API_KEY` is unset or empty.
    Raises:
        ConfigError: the variable named by `api_key_env` is unset or empty; the file named by
            `api_key_file` is missing, not a regular file, unreadable, readable or writable by group or
            others, empty, or more than one line.
    """
    if project.api_key_env:
        key = os.environ.get(project.api_key_env, "")
        if not key.strip():
            raise ConfigError(
                f"api_key_env: ${project.api_key_env} is not set (or empty) in this shell: export it "
                f"(`read -rs {project.api_key_env} && export {project.api_key_env}` keeps it out of the history), "
                "or remove api_key_env from the project file"
            )
        return _one_line(key, f"${project.api_key_env}")
    if project.api_key_file:
        return _read_key_file(Path(project_dir) / Path(project.api_key_file).expanduser())
    return os.environ.get(API_KEY_ENV) or None


def _read_key_file(path: Path) -> str:
    where = f"api_key_file: {path}"
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist: write the key there (chmod 600), or fix the path") from None
    except OSError as err:
        raise ConfigError(f"{where} cannot be read: {err.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{where} is not a regular file: name the file that holds the key")
    if info.st_mode & 0o077:
        raise ConfigError(
            f"{where} is open to other users (mode {stat.S_IMODE(info.st_mode):04o}): the key must be readable by "
            f"its owner only: chmod 600 {path}"
        )
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise ConfigError(f"{where} cannot be read: {reason}") from None
    return _one_line(text.rstrip("\r\n"), where)


def _one_line(key: str, where: str) -> str:
    if not key.strip():
        raise ConfigError(f"{where} is empty: put the API key in it (one line)")
    if "\n" in key or "\r" in key:
        raise ConfigError(f"{where} holds more than one line: the API key is one line")
    return key


def export_api_key(key: str | None) -> None:
    """Make `key` this process's `$DDTREE_API_KEY`, where the HTTP client (and its children) read it."""
    if key:
        os.environ[API_KEY_ENV] = key
