"""Bad sweep input is refused with exit 2 before any host is touched, each with its reason.

The project file names hosts on a closed port of 127.0.0.1: had any check come after a host was
contacted, the command would fail on the connection (exit 1) instead of exit 2.
"""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from json_schemas import validate

from ddtree_ops.cli import cli
from ddtree_ops.config import load_project
from ddtree_ops.exceptions import ConfigError
from ddtree_ops.sweep.plan import SweepConfig, configurations, parse_apply, parse_int_list, plan_sweep


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "ddtree.yaml"
    path.write_text(yaml.safe_dump({
        "hosts": [{"name": "gpu-1", "address": "127.0.0.1", "ssh": {"port": 9}},
                  {"name": "gpu-2", "address": "127.0.0.1", "ssh": {"port": 9}}],
        "engine": {"target": "lab", "draft": "lab", "block_size": 16},
        "services": [{"name": "baseline", "algorithm": "dflash", "port": 39991},
                     {"name": "tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "port": 39992},
                     {"name": "plain", "algorithm": "ar", "port": 39993}],
    }))  # fmt: skip
    return str(path)


def _sweep(config, *args):
    return CliRunner().invoke(cli, ["-c", config, "sweep", *args, "--json"], catch_exceptions=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budgets", "", "--topks", "8"], "--budgets needs at least one value"),
        (["--budgets", "8,15", "--topks", " , "], "--topks needs at least one value"),
        (["--budgets", "8,x", "--topks", "8"], "'x' is not an integer"),
        (["--budgets", "8,-1", "--topks", "8"], "budget -1 < 0"),
        (["--budgets", "8", "--topks", "4,0"], "topk 0 < 1"),
        (["--budgets", "8,15,8", "--topks", "4"], "duplicate configuration budget 8, topk 4: --budgets lists a value twice"),
        (["--budgets", "8", "--topks", "4,4"], "duplicate configuration budget 8, topk 4: --topks lists a value twice"),
        (["--budgets", "8"], "--budgets and --topks are needed"),
        (["--budgets", "8", "--topks", "4", "--services", "plain"], "runs algorithm 'ar'"),
        (["--budgets", "8", "--topks", "4", "--services", "tree,other"], "a sweep redeploys one tree service"),
        (["--budgets", "8", "--topks", "4", "--services", "nope"], "nope"),
        (["--budgets", "8", "--topks", "4", "--hosts", "gpu-9"], "gpu-9"),
        (["--budgets", "8", "--topks", "4", "--apply", "15"], "expected 'best' or BUDGET/TOPK"),
        (["--budgets", "8", "--topks", "4", "--apply", "15/0"], "topk 0 < 1"),
        (["--resume", "/nonexistent/sweep"], "no sweep-state.json there"),
    ],
)
def test_bad_input_exits_2_before_any_host_is_touched(config, args, message):
    result = _sweep(config, *args)
    assert result.exit_code == 2, result.output
    doc = validate(json.loads(result.stdout))
    assert doc["error"]["kind"] in ("config", "usage") and message in doc["error"]["message"], doc


def test_a_folder_that_holds_a_sweep_is_not_overwritten(config, tmp_path):
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "sweep-state.json").write_text("{}")
    result = _sweep(config, "--budgets", "8", "--topks", "4", "--out", str(out))
    assert result.exit_code == 2 and "--resume" in json.loads(result.stdout)["error"]["message"]


def test_an_unhealthy_service_stops_the_sweep_before_anything_changes(config, tmp_path):
    # Input is fine, so the sweep asks the services: none answers, nothing is deployed, no report written.
    out = tmp_path / "sweep"
    result = _sweep(config, "--budgets", "8", "--topks", "4", "--out", str(out))
    assert result.exit_code == 1, result.output
    doc = validate(json.loads(result.stdout))
    assert "nothing was touched" in doc["error"]["message"] and "gpu-1/tree" in doc["error"]["message"]
    assert not (out / "sweep-state.json").exists()


def test_configurations_are_every_budget_times_topk_in_order():
    assert configurations([8, 15], [4, 8]) == [SweepConfig(8, 4), SweepConfig(8, 8), SweepConfig(15, 4), SweepConfig(15, 8)]
    assert SweepConfig(15, 8).verify_width == 16 and SweepConfig(15, 8).key == "b15-k8"
    assert parse_int_list(" 8, 15 ,16", "--budgets") == [8, 15, 16]
    assert parse_apply("best") == "best" and parse_apply("31/4") == SweepConfig(31, 4) and parse_apply(None) is None


def test_the_plan_warns_of_topk_above_budget_and_keeps_the_baseline_out(config):
    plan = plan_sweep(load_project(config), [2, 15], [4], runs=1, max_tokens=8)
    assert [c.key for c in plan.configs] == ["b2-k4", "b15-k4"]
    assert plan.warnings[1:] == ["budget 2, topk 4: topk above the budget: at most 2 candidates per depth are used"]
    assert plan.warnings[0].startswith("--runs 1: one run per prompt per arm is noise")
    assert plan_sweep(load_project(config), [15], [4], runs=3).warnings == []
    assert (plan.tree.name, plan.baseline.name, [h.name for h in plan.hosts]) == ("tree", "baseline", ["gpu-1", "gpu-2"])
    with pytest.raises(ConfigError, match="--baseline and --tree are both"):
        plan_sweep(load_project(config), [2], [4], baseline="tree")
