"""`ddtree-ops sweep` on the real lab fleet: hosts running systemd and sshd, the engine serving the
lab pair, deploys through Ansible. Nothing is replaced: the only hooks are the progress lines the
library hands its caller (to kill a service mid-measurement, or press "Ctrl-C" at a chosen step).

Needs the `lab_fleet` fixture (tests/ddtree_ops/conftest.py); provisions and deploys budget 15,
topk 8 first (idempotent, as the other lab modules do).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from json_schemas import validate

from ddtree_ops.cli import cli
from ddtree_ops.compare.prompts import load_prompts
from ddtree_ops.config import load_project
from ddtree_ops.hosts.ssh import ssh_argv
from ddtree_ops.service.client import ServiceClient, service_url
from ddtree_ops.sweep.drain import in_flight
from ddtree_ops.sweep.execute import execute_sweep, fresh_state
from ddtree_ops.sweep.plan import plan_sweep

pytestmark = [pytest.mark.lab, pytest.mark.slow]

# Two prompts with long answers: decode speed is timed between the first and the last token, so a
# two-token answer ("4") would time almost nothing.
PROMPTS = (
    "- name: code\n  prompt: Write a Python function fibonacci(n) that returns the n-th Fibonacci number iteratively.\n"
    "- name: prose\n  prompt: Write a short paragraph about why the sea looks blue.\n"
)
WARMUP_DELAY_S = 20
LONG_PROMPT = "Write a short paragraph about why the sky looks blue, then another about the sea."
LONG_TOKENS = 200
IN_FLIGHT_REQUESTS = 6


def _run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def deployed_lab(lab_fleet):
    config = str(lab_fleet.config_path)
    provision = _run("-c", config, "provision")
    assert provision.exit_code == 0, provision.output
    deploy = _run("-c", config, "deploy", "--budget", "15", "--topk", "8")
    assert deploy.exit_code == 0, deploy.output
    return config, load_project(config)


@pytest.fixture
def prompts_file(tmp_path) -> str:
    path = tmp_path / "prompts.yaml"
    path.write_text(PROMPTS)
    return str(path)


def _on_host(project, host: str, command: str) -> str:
    return subprocess.run(ssh_argv(project.host(host), command), check=True, capture_output=True, text=True, timeout=60).stdout


def unit_facts(project, host: str, service: str) -> dict[str, str]:
    """systemd's own record of a unit: restarts, main PID, when it last became active."""
    text = _on_host(project, host, f"systemctl show ddtree-{service}.service -p NRestarts,MainPID,ActiveEnterTimestampMonotonic")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def release_of(project, host: str, service: str) -> str:
    state = json.loads(_on_host(project, host, "cat /var/lib/ddtree/state.json"))
    return state["services"][service]["current"]


def tree_settings(project, host: str) -> tuple[int, int]:
    with ServiceClient(service_url(project.host(host), project.service("tree"))) as client:
        info = client.server_info()
    return info["speculative_ddtree_budget"], info["speculative_ddtree_topk"]


def test_a_sweep_over_3_budgets_and_2_topks_on_2_hosts(deployed_lab, prompts_file, tmp_path):
    config, project = deployed_lab
    hosts = [h.name for h in project.hosts]
    baseline_before = {h: (release_of(project, h, "baseline"), unit_facts(project, h, "baseline")) for h in hosts}
    tree_before = {h: release_of(project, h, "tree") for h in hosts}
    out = tmp_path / "sweep"
    started = time.monotonic()
    r = _run("-c", config, "sweep", "--budgets", "8,15,16", "--topks", "4,8", "--runs", "1", "--max-tokens", "32",
             "--prompts", prompts_file, "--out", str(out), "--json")  # fmt: skip
    elapsed = time.monotonic() - started
    assert r.exit_code == 0, r.output
    doc = validate(json.loads(r.stdout))
    print(f"sweep of 6 configurations on 2 hosts: {elapsed:.0f}s")
    assert [c["config"] for c in doc["configs"]] == ["b8-k4", "b8-k8", "b15-k4", "b15-k8", "b16-k4", "b16-k8"]
    assert all(c["complete"] and c["lossless"] and c["speedup"] > 0 and c["tokens_per_step"] >= 1 for c in doc["configs"])
    assert [c["width_rule"] for c in doc["configs"]] == ["< block"] * 2 + ["= block"] * 2 + ["> block"] * 2
    # Every cell was measured only once its service was healthy and idle, on the settings it was given.
    assert len(doc["cells"]) == 12 and all(c["status"] == "ok" for c in doc["cells"])
    assert all(c["health_status_at_ready"] == 200 and c["in_flight_at_ready"] == 0 for c in doc["cells"])
    assert all(c["ready_at"] < c["measured_at"] for c in doc["cells"])
    rec = doc["recommendation"]
    best = max((c for c in doc["configs"]), key=lambda c: c["speedup"])
    assert (rec["budget"], rec["topk"]) == (best["budget"], best["topk"]) and rec["runner_up"] is not None
    for name in ("sweep.json", "sweep.md", "sweep.png", "sweep-state.json"):
        assert (out / name).stat().st_size > 0, name
    assert f"recommended: budget {rec['budget']}, topk {rec['topk']}" in (out / "sweep.md").read_text()
    for h in hosts:
        # The baseline was never touched: same release, not restarted (same PID, same activation).
        assert (release_of(project, h, "baseline"), unit_facts(project, h, "baseline")) == baseline_before[h]
        # The tree service is back on what it ran before: the same release, budget 15, topk 8.
        assert release_of(project, h, "tree") == tree_before[h] and tree_settings(project, h) == (15, 8)
        entry = next(x for x in doc["hosts"] if x["host"] == h)
        assert entry["original"]["release_id"] == entry["final"]["release_id"] == tree_before[h]


def test_a_slow_warm_up_and_a_request_in_flight_are_waited_for(deployed_lab, prompts_file, tmp_path):
    """The original crash: the next configuration started while a request was still running. Here
    requests are in flight when the sweep starts, and every new release holds /health at 503 for
    WARMUP_DELAY_S (the engine's test-only --warmup-delay): the sweep must let every request finish,
    and measure nothing before /health is 200 and nothing is in flight."""
    config, project = deployed_lab
    host = project.hosts[0].name
    slow = yaml.safe_load(Path(config).read_text())
    tree = next(s for s in slow["services"] if s["name"] == "tree")
    tree["extra_args"] = ["--warmup-delay", str(WARMUP_DELAY_S)]
    # Written elsewhere, it keeps checking host keys against the lab's known_hosts (beside the lab's file).
    slow["ssh"] = {**slow.get("ssh", {}), "known_hosts": str(Path(config).with_name("known_hosts"))}
    slow_config = tmp_path / "ddtree.yaml"
    slow_config.write_text(yaml.safe_dump(slow))
    url = service_url(project.host(host), project.service("tree"))
    answers: list = []
    finished_at: list[float] = []
    test_started = time.time()

    def stream() -> None:
        with ServiceClient(url, timeout_s=600) as client:
            try:
                answers.append(client.stream_chat([{"role": "user", "content": LONG_PROMPT}], LONG_TOKENS))
            except Exception as err:  # noqa: BLE001 - the assertion below names it
                answers.append(repr(err))
            finished_at.append(time.time())

    # Several requests at once: the engine serves one at a time, so they stay in flight (running,
    # then queued) for several request-lengths: long enough for the sweep to reach its drain.
    threads = [threading.Thread(target=stream, daemon=True) for _ in range(IN_FLIGHT_REQUESTS)]
    try:
        for thread in threads:
            thread.start()
        with ServiceClient(url) as client:  # the sweep starts once one runs and another waits, by the server's gauges
            deadline = time.monotonic() + 60
            while (held := in_flight(client.metrics())) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert held >= 2, f"the server's in-flight gauges showed {held} of {IN_FLIGHT_REQUESTS} requests"
        r = _run("-c", str(slow_config), "sweep", "--budgets", "16", "--topks", "4", "--hosts", host, "--runs", "1",
                 "--max-tokens", "16", "--prompts", prompts_file, "--out", str(tmp_path / "sweep"), "--drain-timeout", "900",
                 "--json")  # fmt: skip
        for thread in threads:
            thread.join(600)
        assert r.exit_code == 0, r.output
        doc = validate(json.loads(r.stdout))
        # Every request that was in flight when the sweep began ran to its end: none cut off by a restart
        # (a cut stream has no usage chunk, and stream_chat raises).
        assert len(answers) == IN_FLIGHT_REQUESTS and all(not isinstance(a, str) for a in answers), answers
        assert all(a.finish_reason in ("length", "stop") and 0 < a.completion_tokens <= LONG_TOKENS for a in answers)
        # systemd's own record: the first stop of the tree service came after the last request had
        # finished. (uvicorn finishes open requests before it exits, so on this server a too-early
        # restart shows as a stop that began while requests were still being answered.)
        journal = _on_host(project, host, f"journalctl -u ddtree-tree.service --since @{int(test_started)} -o short-unix --no-pager")
        stops = [float(line.split()[0]) for line in journal.splitlines() if "Stopping ddtree-tree.service" in line]
        assert stops and stops[0] >= max(finished_at), (stops, max(finished_at))
        (cell,) = doc["cells"]
        assert cell["status"] == "ok" and cell["drain_waited_s"] > 0.5, cell
        assert cell["healthy_after_s"] >= WARMUP_DELAY_S, cell  # the gate waited through the slow warm-up
        assert (cell["health_status_at_ready"], cell["in_flight_at_ready"]) == (200, 0)
    finally:
        for thread in threads:
            thread.join(600)
        # Back to the lab's own unit (without the delay) for the other tests.
        restore = _run("-c", config, "deploy", "--services", "tree", "--hosts", host, "--budget", "15", "--topk", "8")
        assert restore.exit_code == 0, restore.output


def test_a_service_killed_mid_sweep_fails_that_configuration_and_ends_known(deployed_lab, prompts_file, tmp_path):
    _config, project = deployed_lab
    host = project.hosts[-1].name
    before = release_of(project, host, "tree")
    killed = []

    def progress(line: str) -> None:
        # compare's own line as it sends the first measured request of budget 16: kill the service then.
        if not killed and line.startswith(f"{host}/tree: code run 1/1"):
            if tree_settings(project, host) == (16, 4):
                _on_host(project, host, "systemctl kill -s KILL ddtree-tree.service")
                killed.append("b16")

    plan = plan_sweep(project, [16, 14], [4], hosts=[host], runs=1, max_tokens=64)
    result = execute_sweep(plan, load_prompts(prompts_file), fresh_state(plan, load_prompts(prompts_file), tmp_path / "s"),
                           progress=progress)  # fmt: skip
    assert killed == ["b16"]
    doc = result.doc
    cells = {c["config"]: c for c in doc["cells"]}
    assert cells["b16-k4"]["status"] == "failed", cells["b16-k4"]
    assert "last journal lines of ddtree-tree.service" in cells["b16-k4"]["error"]
    assert "status=9/KILL" in cells["b16-k4"]["error"]
    assert cells["b14-k4"]["status"] == "ok"  # the sweep went on once systemd had it back
    assert doc["ok"] is False and any("budget 16, topk 4" in f["message"] for f in doc["failures"])
    assert release_of(project, host, "tree") == before and tree_settings(project, host) == (15, 8)
    (entry,) = doc["hosts"]
    assert entry["final"]["release_id"] == before and entry["final"]["healthy"] is True


def test_resume_measures_nothing_that_finished_and_apply_best_deploys_the_recommendation(deployed_lab, prompts_file, tmp_path):
    config, project = deployed_lab
    host = project.hosts[0].name
    before = release_of(project, host, "tree")
    out = tmp_path / "sweep"

    def ctrl_c(line: str) -> None:
        if line == f"{host}/tree: budget 14, topk 8: draining":
            raise KeyboardInterrupt

    prompts = load_prompts(prompts_file)
    plan = plan_sweep(project, [16, 14], [8], hosts=[host], runs=1, max_tokens=16)
    first = execute_sweep(plan, prompts, fresh_state(plan, prompts, out), progress=ctrl_c).doc
    assert first["interrupted"] and [c["config"] for c in first["cells"]] == ["b16-k8"]
    # Interrupted: put back on what it ran before the sweep, at once.
    assert release_of(project, host, "tree") == before and tree_settings(project, host) == (15, 8)
    finished = first["cells"][0]
    try:
        r = _run("-c", config, "sweep", "--resume", str(out), "--apply", "best", "--json")
        assert r.exit_code == 0, r.output
        doc = validate(json.loads(r.stdout))
        assert doc["resumed_skipped"] == [f"b16-k8/{host}"]
        cells = {c["config"]: c for c in doc["cells"]}
        assert cells["b16-k8"] == finished  # not measured again: same deploy, same figures, same times
        assert cells["b14-k8"]["status"] == "ok" and cells["b14-k8"]["deploy_id"] != finished["deploy_id"]
        assert [run["ended"] for run in doc["runs"]] == ["interrupted", "finished"]
        rec = doc["recommendation"]
        assert doc["applied"] == {"budget": rec["budget"], "topk": rec["topk"], "why": "the recommendation"}
        assert tree_settings(project, host) == (rec["budget"], rec["topk"])
        assert doc["hosts"][0]["final"]["budget"] == rec["budget"]
    finally:
        restore = _run("-c", config, "deploy", "--services", "tree", "--hosts", host, "--budget", "15", "--topk", "8")
        assert restore.exit_code == 0, restore.output
    assert release_of(project, host, "tree") == before
