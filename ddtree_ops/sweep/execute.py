"""A sweep from start to documents: plan or resume, run, and the one document every output shares
(`sweep.json`, the `--json` envelope, the Markdown and the chart)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..compare.prompts import Prompt
from ..config import Project
from ..exceptions import ConfigError
from ..progress import Progress, silent
from ..service.metrics_text import ACCEPT_DEFINITION
from .plan import SweepConfig, SweepPlan, configurations, plan_sweep
from .report import config_rows, host_bests, recommend, write_report_files
from .run import DRAIN_TIMEOUT_S, SweepOutcome, SweepRun, SweepSeams, settings_of
from .state import SweepState, load_state, new_state


@dataclass
class SweepResult:
    doc: dict[str, Any]  # sweep.json (and the --json document, less the envelope's `command`)
    files: dict[str, Path]

    @property
    def ok(self) -> bool:
        return bool(self.doc["ok"])


def _prompts_from(settings: dict[str, Any]) -> list[Prompt]:
    return [Prompt(p["name"], tuple(dict(m) for m in p["messages"])) for p in settings["prompts"]]


def resume_plan(project: Project, out_dir: Path, apply: str | SweepConfig | None, overrides: dict[str, Any]) -> tuple[SweepPlan, list[Prompt], SweepState]:
    """The plan of an interrupted sweep, from its folder's state.

    Args:
        project: the validated project file.
        out_dir: the folder given to `--resume`.
        apply: `--apply` of this invocation.
        overrides: command-line values given again (budgets, topks, hosts, runs, max_tokens); each must
            equal the saved one, since a resumed sweep measures exactly what the first run planned.

    Raises:
        ConfigError: no readable state there, or a value that differs from the saved one.
    """
    state = load_state(out_dir)
    s = state.settings
    for key, value in overrides.items():
        if value is not None and value != s.get(key):
            raise ConfigError(
                f"--resume {out_dir}: --{key.replace('_', '-')} {value} differs from the sweep's {s.get(key)}; "
                "leave it out to resume, or start a new sweep with another --out"
            )
    plan = plan_sweep(project, s["budgets"], s["topks"], tree=s["tree"], baseline=s["baseline"], hosts=s["hosts"],
                      runs=s["runs"], max_tokens=s["max_tokens"], apply=apply)  # fmt: skip
    return plan, _prompts_from(s), state


def fresh_state(plan: SweepPlan, prompts: Sequence[Prompt], out_dir: Path) -> SweepState:
    """A new state in `out_dir` (ConfigError when a sweep is already there)."""
    return new_state(out_dir, settings_of(plan, prompts))


def build_document(plan: SweepPlan, state: SweepState, outcome: SweepOutcome) -> dict[str, Any]:
    """sweep.json: settings, one row per configuration, every cell, the recommendation, where each
    service was before and is now, failures and warnings (schemas/sweep.json)."""
    hosts = [h.name for h in plan.hosts]
    rows = config_rows(plan.configs, hosts, state.cells, plan.block_size)
    bests = host_bests(plan.configs, hosts, state.cells)
    ordered = [state.cells[k] for c in plan.configs for h in hosts if (k := f"{c.key}/{h}") in state.cells]
    return {
        "ok": not outcome.failures,
        "started_at": state.started_at,
        "accept_definition": ACCEPT_DEFINITION,
        "settings": state.settings,
        "interrupted": outcome.interrupted,
        "configs": rows,
        "recommendation": recommend(rows),
        "applied": outcome.applied,
        "hosts": [
            {"host": h, "original": state.original.get(h), "final": state.current.get(h), "best": bests.get(h)}
            for h in hosts
        ],
        "cells": ordered,
        "resumed_skipped": outcome.resumed_skipped,
        "runs": state.runs,
        "failures": outcome.failures,
        "warnings": list(dict.fromkeys(outcome.warnings)),
    }


def execute_sweep(
    plan: SweepPlan,
    prompts: Sequence[Prompt],
    state: SweepState,
    *,
    progress: Progress = silent,
    seams: SweepSeams | None = None,
    drain_timeout_s: float = DRAIN_TIMEOUT_S,
    timeout_s: float = 600.0,
) -> SweepResult:
    """Run (or continue) a sweep and write its reports into the state's folder.

    Args:
        plan: from `plan_sweep` or `resume_plan`.
        prompts: what compare sends for each configuration.
        state: from `fresh_state` or `resume_plan`.
        progress: one line per step (the CLI prints them on stderr).
        seams: the Ansible runner and the SSH transport (the real ones by default).
        drain_timeout_s: the longest wait for a service to hold no request.
        timeout_s: per request.

    Returns:
        the document and the report files; `ok` is False when a cell failed, a service could not
        be put back, or the sweep was interrupted.

    Raises:
        CheckFailed: a service was unhealthy before anything was touched (no report is written).
    """
    run = SweepRun(plan, prompts, state, progress=progress, seams=seams, drain_timeout_s=drain_timeout_s, timeout_s=timeout_s)

    def pick_best() -> SweepConfig | None:
        rec = recommend(config_rows(plan.configs, [h.name for h in plan.hosts], state.cells, plan.block_size))
        return None if rec is None else SweepConfig(rec["budget"], rec["topk"])

    outcome = run.run(pick_best)
    doc = build_document(plan, state, outcome)
    return SweepResult(doc, write_report_files(doc, state.path.parent))


__all__ = ["configurations", "execute_sweep", "fresh_state", "resume_plan", "SweepResult"]
