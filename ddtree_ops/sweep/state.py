"""What a sweep has done so far, kept in its output folder (`sweep-state.json`) after every step.

It holds the settings (so `--resume DIR` measures the same thing), what each tree service ran
before the sweep (so it can be put back), and one cell per configuration and host once that cell
is finished. A resumed sweep skips the cells whose status is "ok" (measured); failed and
unfinished cells are tried again. Written to a temporary file and renamed, so an interrupt
mid-write leaves the previous state whole.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..exceptions import ConfigError

STATE_FILE = "sweep-state.json"
STATE_VERSION = 1
CELL_OK = "ok"  # measured (its lossless check may still have failed: that is a result)
CELL_FAILED = "failed"  # not measured: drain timed out, the deploy gate failed, a request failed
CELL_SKIPPED = "skipped"  # not tried: its host had dropped out, or the sweep was interrupted first


def now_iso() -> str:
    """UTC, to the millisecond (cells and events are ordered by it)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def cell_key(config_key: str, host: str) -> str:
    return f"{config_key}/{host}"


@dataclass
class SweepState:
    """The sweep folder's memory; `save()` after every change that must survive an interrupt."""

    path: Path
    settings: dict[str, Any]
    original: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> {budget, topk, release_id}
    cells: dict[str, dict[str, Any]] = field(default_factory=dict)  # cell_key -> the cell's result
    current: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> what its tree service runs now
    started_at: str = field(default_factory=now_iso)
    runs: list[dict[str, Any]] = field(default_factory=list)  # one entry per invocation: started, resumed, ended how

    def finished(self, config_key: str, host: str) -> bool:
        """Measured already (a resumed sweep does not measure it again)."""
        return (self.cells.get(cell_key(config_key, host)) or {}).get("status") == CELL_OK

    def record(self, cell: dict[str, Any]) -> None:
        self.cells[cell_key(cell["config"], cell["host"])] = cell
        self.save()

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "started_at": self.started_at,
            "settings": self.settings,
            "original": self.original,
            "current": self.current,
            "cells": self.cells,
            "runs": self.runs,
        }

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")
        os.replace(tmp, self.path)


def new_state(out_dir: Path, settings: dict[str, Any]) -> SweepState:
    """A fresh state for `out_dir` (nothing is written until the sweep starts).

    Raises:
        ConfigError: `out_dir` cannot be written, or already holds a sweep (resume it with --resume,
            or choose another --out).
    """
    existing = out_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise ConfigError(f"--out {out_dir}: cannot write the reports there ({existing} is not a writable folder); choose another folder")
    path = out_dir / STATE_FILE
    if path.exists():
        raise ConfigError(
            f"--out {out_dir}: it already holds a sweep ({path}); continue it with --resume {out_dir}, "
            "or choose another --out"
        )
    return SweepState(path=path, settings=settings)


def load_state(out_dir: Path) -> SweepState:
    """The state of an earlier sweep in `out_dir` (`--resume DIR`).

    Raises:
        ConfigError: there is none, or it cannot be read (naming the file and the fix).
    """
    path = Path(out_dir) / STATE_FILE
    if not path.is_file():
        raise ConfigError(f"--resume {out_dir}: no {STATE_FILE} there; name the --out folder of the sweep to continue")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"--resume {out_dir}: {path} cannot be read ({err}); start a new sweep with another --out") from None
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION or not isinstance(data.get("settings"), dict):
        raise ConfigError(f"--resume {out_dir}: {path} is not a sweep state of version {STATE_VERSION}; start a new sweep")
    return SweepState(
        path=path,
        settings=data["settings"],
        original=data.get("original") or {},
        cells=data.get("cells") or {},
        current=data.get("current") or {},
        started_at=data.get("started_at") or now_iso(),
        runs=data.get("runs") or [],
    )
