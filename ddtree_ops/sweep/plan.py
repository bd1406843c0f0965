"""The sweep's plan (pure): parse and check the command line against the project file before any
host is touched (ConfigError, exit 2), and lay out the configurations to measure."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Sequence

from ..compare.run import NOISY_RUNS_WARNING, plan_hosts, validate_compare_args
from ..config import Host, Project, Service
from ..exceptions import ConfigError

APPLY_BEST = "best"


@dataclass(frozen=True, order=True)
class SweepConfig:
    """One tree configuration: `budget` drafted nodes verified per step, `topk` candidates per depth."""

    budget: int
    topk: int

    @property
    def key(self) -> str:
        """`b15-k8`: names the configuration in sweep-state.json and progress lines."""
        return f"b{self.budget}-k{self.topk}"

    @property
    def label(self) -> str:
        return f"{self.budget}/{self.topk}"

    @property
    def verify_width(self) -> int:
        """Tokens the target verifies per step: the root plus `budget` nodes."""
        return self.budget + 1


def parse_int_list(text: str | None, option: str) -> list[int]:
    """`"8,15,16"` -> [8, 15, 16].

    Raises:
        ConfigError: the list is empty or an item is not an integer (naming `option` and the item).
    """
    items = [t.strip() for t in (text or "").split(",") if t.strip()]
    if not items:
        raise ConfigError(f"{option} needs at least one value (comma-separated, e.g. {option} 8,15,16)")
    values = []
    for item in items:
        try:
            values.append(int(item))
        except ValueError:
            raise ConfigError(f"{option}: {item!r} is not an integer (give a comma list such as 8,15,16)") from None
    return values


def parse_config(text: str, option: str) -> SweepConfig:
    """`"15/8"` -> SweepConfig(15, 8); raises ConfigError for anything else (or budget < 0, topk < 1)."""
    budget_text, sep, topk_text = text.partition("/")
    try:
        config = SweepConfig(int(budget_text), int(topk_text))
    except ValueError:
        raise ConfigError(f"{option} {text!r}: expected {APPLY_BEST!r} or BUDGET/TOPK such as 15/8") from None
    if not sep:
        raise ConfigError(f"{option} {text!r}: expected {APPLY_BEST!r} or BUDGET/TOPK such as 15/8")
    _check_values([config.budget], [config.topk], option)
    return config


def parse_apply(text: str | None) -> str | SweepConfig | None:
    """`--apply`: None (restore what ran before), "best", or a named BUDGET/TOPK."""
    if text is None:
        return None
    if text.strip() == APPLY_BEST:
        return APPLY_BEST
    return parse_config(text.strip(), "--apply")


def _check_values(budgets: Sequence[int], topks: Sequence[int], where: str) -> None:
    bad_budgets = [b for b in budgets if b < 0]
    if bad_budgets:
        raise ConfigError(f"{where}: budget {bad_budgets[0]} < 0: the tree budget must be >= 0 (0 verifies the root alone)")
    bad_topks = [k for k in topks if k < 1]
    if bad_topks:
        raise ConfigError(f"{where}: topk {bad_topks[0]} < 1: topk must be >= 1")


def configurations(budgets: Sequence[int], topks: Sequence[int]) -> list[SweepConfig]:
    """Every budget × topk, budgets outermost, in the order given.

    Raises:
        ConfigError: a budget < 0, a topk < 1, or a configuration listed twice (a value repeated).
    """
    _check_values(budgets, [], "--budgets")
    _check_values([], topks, "--topks")
    configs = [SweepConfig(b, k) for b, k in itertools.product(budgets, topks)]
    seen: set[SweepConfig] = set()
    for config in configs:
        if config in seen:
            repeated = "--budgets" if budgets.count(config.budget) > 1 else "--topks"
            raise ConfigError(
                f"duplicate configuration budget {config.budget}, topk {config.topk}: {repeated} lists a value twice; "
                "list each value once"
            )
        seen.add(config)
    return configs


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep will do, decided before any host is touched."""

    project: Project
    baseline: Service
    tree: Service
    hosts: list[Host]
    configs: list[SweepConfig]
    runs: int
    max_tokens: int
    apply: str | SweepConfig | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def block_size(self) -> int:
        return self.project.engine.block_size


def tree_service_name(services: Sequence[str] | None) -> str:
    """The one tree service `--services` names (default "tree").

    Raises:
        ConfigError: more than one name (a sweep redeploys one service at a time).
    """
    names = list(services or [])
    if not names:
        return "tree"
    if len(names) > 1:
        raise ConfigError(
            f"--services {','.join(names)}: a sweep redeploys one tree service; name one (run a sweep per service)"
        )
    return names[0]


def plan_sweep(
    project: Project,
    budgets: Sequence[int],
    topks: Sequence[int],
    *,
    tree: str = "tree",
    baseline: str = "baseline",
    hosts: Sequence[str] | None = None,
    runs: int = 3,
    max_tokens: int = 128,
    apply: str | SweepConfig | None = None,
) -> SweepPlan:
    """Check everything and lay out the sweep.

    Args:
        project: the validated project file.
        budgets, topks: the values to try (every combination is measured).
        tree, baseline: service names; `tree` must be a `ddtree` service, and the baseline is never touched.
        hosts: restrict to these hosts (None: every host running both services).
        runs, max_tokens: per configuration, as `compare` takes them.
        apply: what to leave deployed at the end (None: what ran before; "best"; a SweepConfig).

    Returns:
        the plan, with warnings (topk above budget: candidates that cannot be used).

    Raises:
        ConfigError: anything wrong, before any host is contacted.
    """
    configs = configurations(budgets, topks)
    baseline_svc, tree_svc = validate_compare_args(project, baseline, tree, runs, max_tokens)
    if tree_svc.algorithm != "ddtree":
        raise ConfigError(
            f"--services {tree}: service {tree!r} runs algorithm {tree_svc.algorithm!r}; a sweep tunes a 'ddtree' "
            "service's budget and topk: name one"
        )
    selected = plan_hosts(project, baseline_svc, tree_svc, hosts)
    warnings = [NOISY_RUNS_WARNING] if runs == 1 else []
    warnings += [
        f"budget {c.budget}, topk {c.topk}: topk above the budget: at most {max(c.budget, 1)} candidates per depth are used"
        for c in configs
        if c.topk > max(c.budget, 1)
    ]
    return SweepPlan(project, baseline_svc, tree_svc, selected, configs, runs, max_tokens, apply, warnings)
