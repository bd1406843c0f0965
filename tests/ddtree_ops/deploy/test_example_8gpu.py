"""examples/ddtree-8gpu.yaml: loaded by the real config loader, planned by deploy, its units rendered and verified."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from ddtree_ops.config import load_project
from ddtree_ops.deploy.plan import plan_deploy
from ddtree_ops.deploy.units import render_unit

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "ddtree-8gpu.yaml"


def rendered(env: str) -> dict[str, str]:
    plan = plan_deploy(load_project(EXAMPLE))
    return {s.service: render_unit(s.spec, env) for h in plan.hosts for s in h.services}


def argv_of(unit: str) -> list[str]:
    return shlex.split(next(line for line in unit.splitlines() if line.startswith("ExecStart=")).removeprefix("ExecStart="))


def test_the_example_is_one_sglang_host_with_a_service_per_gpu():
    project = load_project(EXAMPLE)
    assert project.engine.backend == "sglang" and len(project.hosts) == 1 and len(project.hosts[0].gpus) == 8
    algorithms = [s.algorithm for s in project.services]
    assert algorithms.count("dflash") == 1 and algorithms.count("ddtree") >= 3
    pinned = sorted(g for s in project.services for g in s.gpus)
    assert pinned == list(range(8)), "every GPU serves exactly one service"


def test_its_units_run_sglang_pinned_to_their_own_gpu():
    project = load_project(EXAMPLE)
    uuids = project.hosts[0].gpus
    units = rendered("/opt/ddtree/envs/0123abcd")
    assert set(units) == {s.name for s in project.services}
    for service in project.services:
        unit, argv = units[service.name], argv_of(units[service.name])
        assert argv[0] == "/opt/ddtree/envs/0123abcd/bin/python" and "sglang.launch_server" in argv[2]
        assert f"Environment=CUDA_VISIBLE_DEVICES={uuids[service.gpus[0]]}\n" in unit
        assert argv[argv.index("--port") + 1] == str(service.port)
        algorithm = argv[argv.index("--speculative-algorithm") + 1] if "--speculative-algorithm" in argv else None
        assert algorithm == {"dflash": "DFLASH", "ddtree": "DDTREE", "ar": None}[service.algorithm]
        if service.algorithm == "ddtree":
            assert argv[argv.index("--speculative-ddtree-budget") + 1] == str(service.budget)
            assert argv[argv.index("--speculative-ddtree-topk") + 1] == str(service.topk)
            assert argv[argv.index("--speculative-ddtree-spine-depth") + 1] == str(service.spine_depth)
        assert argv[argv.index("--dtype") + 1] == "bfloat16"


def test_deploy_warns_about_the_trees_that_are_not_at_equal_cost():
    warnings = plan_deploy(load_project(EXAMPLE)).warnings
    widened = sorted(w.split("'")[1] for w in warnings if "differs from block size" in w)
    assert widened == ["tree-b31-k8", "tree-b63-k8", "tree-b7-k4"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_its_units_pass_systemd_analyze_verify(tmp_path):
    (tmp_path / "env" / "bin").mkdir(parents=True)
    python = tmp_path / "env" / "bin" / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    paths = []
    for name, unit in rendered(str(tmp_path / "env")).items():
        path = tmp_path / f"ddtree-{name}.service"
        path.write_text(unit)
        paths.append(str(path))
    proc = subprocess.run(["systemd-analyze", "verify", *paths], check=False, capture_output=True, text=True)
    complaints = [line for line in proc.stderr.splitlines() if "ddtree-" in line]
    assert proc.returncode == 0 and not complaints, proc.stderr
