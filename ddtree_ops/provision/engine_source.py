"""The engine's sources on the control node: where they are, their digest (part of every lock's
identity), their declared version and dependencies, and the wheel's file name."""

from __future__ import annotations

import hashlib
import os
import tomllib
from pathlib import Path

from ..exceptions import DdtreeOpsError
from ..state import repo_root

ENGINE_SRC_ENV = "DDTREE_ENGINE_SRC"
ENGINE_NAME = "ddtree-engine"
_SKIP_PARTS = {"__pycache__", "build", "dist"}


def engine_source_dir() -> Path:
    """The engine's source folder ($DDTREE_ENGINE_SRC, else engine_patches/ddtree_engine). Raises DdtreeOpsError."""
    path = Path(os.environ.get(ENGINE_SRC_ENV) or repo_root() / "engine_patches" / "ddtree_engine")
    if not (path / "pyproject.toml").is_file():
        raise DdtreeOpsError(f"no engine sources at {path} (pyproject.toml missing); set ${ENGINE_SRC_ENV}")
    return path


def _engine_files(engine_dir: Path) -> list[Path]:
    files = [engine_dir / "pyproject.toml"]
    for path in sorted((engine_dir / "src").rglob("*")):
        rel = path.relative_to(engine_dir)
        if not path.is_file() or path.suffix == ".pyc":
            continue
        if any(p in _SKIP_PARTS or p.endswith(".egg-info") for p in rel.parts):
            continue
        files.append(path)
    return files


def engine_source_digest(engine_dir: Path) -> str:
    """sha256 over the engine's pyproject.toml and src/ (paths and contents, sorted)."""
    digest = hashlib.sha256()
    for path in _engine_files(engine_dir):
        digest.update(str(path.relative_to(engine_dir)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def engine_metadata(engine_dir: Path) -> tuple[str, list[str]]:
    """(version, declared dependencies) from the engine's pyproject.toml."""
    project = tomllib.loads((engine_dir / "pyproject.toml").read_text())["project"]
    return project["version"], list(project.get("dependencies", []))


def engine_wheel_name(engine_dir: Path | None = None) -> str:
    """The engine wheel's file name (pure Python: one wheel for every host)."""
    version, _ = engine_metadata(engine_dir or engine_source_dir())
    return f"ddtree_engine-{version}-py3-none-any.whl"
