"""What a service's `/server_info` must report, and where it disagrees (one rule for deploy's gate and healthcheck)."""

from __future__ import annotations

from typing import Any

from .dialect import expected_draft_keys


def expected(
    algorithm: str, block_size: int | None, budget: int | None, topk: int | None, backend: str = "reference"
) -> dict[str, Any]:
    """The values a service of `algorithm` must report. The block size only applies to speculative
    algorithms: the drafter decides it, so a project file that says otherwise is caught here (how it
    shows depends on the backend: `dialect.expected_draft_keys`)."""
    values: dict[str, Any] = {"speculative_algorithm": str(algorithm).upper()}
    values.update(expected_draft_keys(backend, algorithm, block_size, budget))
    if algorithm == "ddtree":
        values["speculative_ddtree_budget"] = budget
        values["speculative_ddtree_topk"] = topk
    return values


def mismatches(expected_values: dict[str, Any], info: dict[str, Any]) -> list[str]:
    """Each key where the server disagrees with what was deployed, as `key: server says X, deployed Y`.
    Strings compare case-insensitively (`ddtree` = `DDTREE`)."""
    problems = []
    for key, want in expected_values.items():
        got = info.get(key)
        same = got.upper() == want.upper() if isinstance(want, str) and isinstance(got, str) else got == want
        if not same:
            problems.append(f"{key}: server says {got!r}, deployed {want!r}")
    return problems
