"""healthcheck (HTTP checks) and compare against real `ddtree-engine serve` processes on localhost.

Four servers over tiny random pairs: `baseline` (dflash), `tree` (ddtree, budget 15, topk 8) and
`ar` over the same pair, and `impostor`, a dflash server over a *different* pair that the project
file calls `ar` — so the lossless check and the server_info check have something real to catch.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from click.testing import CliRunner

from ddtree_ops.cli import cli
from ddtree_ops.compare.run import run_compare
from ddtree_ops.config import load_project
from ddtree_ops.health.check import run_healthcheck
from ddtree_ops.service.metrics_text import GENERATION_TOKENS, NUM_REQUESTS, SPEC_VERIFY_CALLS, parse_metrics
from ddtree_ops.compare.prompts import BUILTIN_PROMPTS

REPO = Path(__file__).resolve().parents[3]
ENGINE_SRC = REPO / "engine_patches" / "ddtree_engine" / "src"
START_TIMEOUT_S = 180


def _engine_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ENGINE_SRC), env.get("PYTHONPATH", "")) if p)
    return env


def _engine(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ddtree_engine.cli", *args], env=_engine_env(), check=True, capture_output=True, text=True, **kw
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Start the three servers; yield {name: port} and the pair directories."""
    root = tmp_path_factory.mktemp("fleet")
    _engine("make-tiny-pair", str(root / "pair0"), "--arch", "qwen3", "--seed", "0", timeout=300)
    _engine("make-tiny-pair", str(root / "pair1"), "--arch", "qwen3", "--seed", "1", timeout=300)
    specs = {
        "baseline": ("pair0", ["--algorithm", "dflash"]),
        "tree": ("pair0", ["--algorithm", "ddtree", "--budget", "15", "--topk", "8"]),
        "ar": ("pair0", ["--algorithm", "ar"]),
        "impostor": ("pair1", ["--algorithm", "dflash"]),
    }
    procs, ports, by_name = [], {}, {}
    try:
        for name, (pair, args) in specs.items():
            ports[name] = _free_port()
            log = open(root / f"{name}.log", "w")
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable, "-m", "ddtree_engine.cli", "serve",
                        "--target", str(root / pair / "target"), "--draft", str(root / pair / "draft"),
                        *args, "--host", "127.0.0.1", "--port", str(ports[name]), "--log-level", "warning",
                    ],
                    env=_engine_env(), stdout=log, stderr=subprocess.STDOUT,
                )
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        for name, port in ports.items():
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    pytest.fail(f"server {name} did not become healthy:\n{(root / f'{name}.log').read_text()[-3000:]}")
                time.sleep(0.5)
        by_name = dict(zip(specs, procs))
        yield {"root": root, "ports": ports, "procs": by_name}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def write_project(fleet, path: Path, tree_budget: int = 15) -> Path:
    ports = fleet["ports"]
    doc = {
        "hosts": [{"name": "local", "address": "127.0.0.1"}],
        "engine": {"target": str(fleet["root"] / "pair0" / "target"), "draft": str(fleet["root"] / "pair0" / "draft")},
        "services": [
            {"name": "baseline", "algorithm": "dflash", "port": ports["baseline"]},
            {"name": "tree", "algorithm": "ddtree", "budget": tree_budget, "topk": 8, "port": ports["tree"]},
            {"name": "ar", "algorithm": "ar", "port": ports["ar"]},
            {"name": "impostor", "algorithm": "ar", "port": ports["impostor"]},
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


# ---- healthcheck -------------------------------------------------------------------------------


def test_healthcheck_http_checks_pass(fleet, tmp_path):
    project = load_project(write_project(fleet, tmp_path / "ddtree.yaml"))
    report = run_healthcheck(project, service_names=["baseline", "tree", "ar"], check_systemd=False)
    assert report.ok, report.failures()
    by_name = {r.service: r for r in report.results}
    assert by_name["tree"].info["speculative_ddtree_budget"] == 15
    assert by_name["tree"].generation_tokens == 8
    # ar commits exactly one token per verify step, whatever traffic the server saw before.
    assert by_name["ar"].accept_length == 1.0 and by_name["ar"].accept_source == "verify_committed_tokens"
    # The speculative arms: lifetime committed tokens per verify step, read back here from the
    # token and request counters instead (each request's first token is its prefill's, not a step's).
    for name in ("baseline", "tree"):
        m = parse_metrics(httpx.get(f"http://127.0.0.1:{fleet['ports'][name]}/metrics").text)
        committed = m.total(GENERATION_TOKENS) - m.total(NUM_REQUESTS)
        assert by_name[name].accept_length == pytest.approx(committed / m.total(SPEC_VERIFY_CALLS)), name


def test_healthcheck_names_a_service_not_configured_as_deployed(fleet, tmp_path):
    path = write_project(fleet, tmp_path / "ddtree.yaml", tree_budget=7)
    r = CliRunner().invoke(cli, ["-c", str(path), "healthcheck", "--no-systemd"], catch_exceptions=False)
    assert r.exit_code == 1, r.output
    assert "local/tree: server_info: speculative_ddtree_budget: server says 15, deployed 7" in r.output
    assert "local/impostor: server_info: speculative_algorithm: server says 'DFLASH', deployed 'AR'" in r.output
    assert "local/baseline:" not in r.output.split("healthcheck failed:")[1]


def test_healthcheck_cli_table(fleet, tmp_path):
    path = write_project(fleet, tmp_path / "ddtree.yaml")
    r = CliRunner().invoke(
        cli, ["-c", str(path), "healthcheck", "--no-systemd", "--services", "baseline,tree"], catch_exceptions=False
    )
    assert r.exit_code == 0, r.output
    assert "ddtree healthcheck" in r.stdout and r.stdout.count(" ok ") >= 2


# ---- compare -----------------------------------------------------------------------------------


def test_compare_library(fleet, tmp_path):
    project = load_project(write_project(fleet, tmp_path / "ddtree.yaml"))
    prompts = [p for p in BUILTIN_PROMPTS if p.name in ("code", "json")]
    report = run_compare(project, prompts, runs=2, max_tokens=24)
    assert report.ok, report.failures
    assert len(report.runs) == 2 * 2 * 2
    # Arms alternate: run 0 baseline first, run 1 tree first.
    order = [(r.prompt, r.run, r.arm) for r in report.runs]
    assert order[:4] == [("code", 0, "baseline"), ("code", 0, "tree"), ("code", 1, "tree"), ("code", 1, "baseline")]
    for r in report.runs:
        # Token counts are usage's, and usage agrees with the ids and the /metrics delta.
        assert r.completion_tokens == len(r.token_ids) == r.generation_tokens_delta
        assert 1 <= r.completion_tokens <= 24
        # Acceptance from counter deltas equals this request's own step records (the `ddtree` field),
        # which commit every token but the prefill's.
        assert r.server_committed_tokens == r.completion_tokens - 1
        assert r.accept_length == pytest.approx(r.server_committed_tokens / r.server_verify_steps)
        assert r.ttft_s > 0 and r.error is None
    assert [s.lossless.ok for s in report.summaries] == [True, True]
    assert all("token for token" in s.lossless.detail for s in report.summaries)


def test_compare_acceptance_against_ar(fleet, tmp_path):
    project = load_project(write_project(fleet, tmp_path / "ddtree.yaml"))
    prompts = [p for p in BUILTIN_PROMPTS if p.name == "code"]
    report = run_compare(project, prompts, baseline="ar", tree="tree", runs=2, max_tokens=16)
    assert report.ok, report.failures
    ar_runs = [r for r in report.runs if r.arm == "baseline"]
    tree_runs = [r for r in report.runs if r.arm == "tree"]
    # ar: n tokens = the prefill's + n - 1 one-token verify steps, so exactly 1.0 (n / (n - 1) counted the prefill's).
    for r in ar_runs:
        assert r.completion_tokens >= 3 and r.server_verify_steps == r.completion_tokens - 1
        assert r.accept_length == 1.0
    assert report.summaries[0].baseline.accept_length == 1.0
    for r in tree_runs:
        assert r.accept_length == pytest.approx(r.server_committed_tokens / r.server_verify_steps)
    assert report.summaries[0].tree.accept_length == pytest.approx(
        statistics.median(r.server_committed_tokens / r.server_verify_steps for r in tree_runs)
    )


def test_compare_cli_writes_files(fleet, tmp_path):
    path = write_project(fleet, tmp_path / "ddtree.yaml")
    out = tmp_path / "out"
    r = CliRunner().invoke(
        cli,
        ["-c", str(path), "compare", "--runs", "1", "--max-tokens", "16", "--out", str(out), "--json"],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["settings"]["runs"] == 1
    assert doc["accept_definition"] == "accept = committed tokens per verify step, prefill excluded"
    assert {run["accept_source"] for run in doc["runs"]} == {"verify_committed_tokens"}
    assert [p["name"] for p in doc["settings"]["prompts"]] == [p.name for p in BUILTIN_PROMPTS]
    assert all(p["lossless"]["ok"] for p in doc["prompts"])
    assert json.loads((out / "compare.json").read_text())["totals"] == doc["totals"]
    markdown = (out / "compare.md").read_text()
    assert "| local | code |" in markdown
    assert "\naccept = committed tokens per verify step, prefill excluded" in markdown
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG"

    table = CliRunner().invoke(
        cli, ["-c", str(path), "compare", "--runs", "1", "--max-tokens", "8", "--out", str(tmp_path / "o2")],
        catch_exceptions=False,
    )
    assert table.exit_code == 0, table.output
    assert "geomean speedup overall" in table.stdout and "✓" in table.stdout
    assert "accept = committed tokens per verify step, prefill excluded" in table.stdout


def test_compare_catches_a_lossy_arm(fleet, tmp_path):
    # The impostor serves a different model: its output differs, which must fail the run.
    path = write_project(fleet, tmp_path / "ddtree.yaml")
    r = CliRunner().invoke(
        cli,
        ["-c", str(path), "compare", "--tree", "impostor", "--runs", "1", "--max-tokens", "12", "--out", str(tmp_path / "o")],
        catch_exceptions=False,
    )
    assert r.exit_code == 1, r.output
    assert "✗" in r.stdout
    assert "local: the arms serve different targets" in r.stdout
    assert "local: prompt 'code': lossless check failed: tree run 0 differs from baseline run 0 at token" in r.output


def test_compare_gives_up_on_a_host_that_stops_answering_mid_run(fleet, tmp_path):
    """A host that goes silent mid-compare (here its tree server frozen with SIGSTOP: the kernel still
    accepts connections, nothing answers, as with a host cut off) costs one --stall-timeout, not the
    request timeout on every remaining run; the runs before it stay in the report."""
    project = load_project(write_project(fleet, tmp_path / "ddtree.yaml"))
    prompts = [p for p in BUILTIN_PROMPTS if p.name in ("code", "json", "prose")]
    tree = fleet["procs"]["tree"]
    frozen = []

    def progress(message: str) -> None:
        # Freeze the tree server just before the second prompt's first tree request goes out.
        if message.startswith("local/tree: json run 1/") and not frozen:
            os.kill(tree.pid, signal.SIGSTOP)
            frozen.append(time.monotonic())

    t0 = time.monotonic()
    try:
        report = run_compare(project, prompts, runs=2, max_tokens=8, timeout_s=300, stall_s=3, progress=progress)
    finally:
        os.kill(tree.pid, signal.SIGCONT)
    assert frozen, "the tree server was never frozen: the progress line changed"
    assert time.monotonic() - frozen[0] < 30, "compare waited for the request timeout, not the stall timeout"
    assert not report.ok
    [fail] = report.failures
    assert fail["host"] == "local" and fail["service"] == "tree"
    assert "sent nothing for 3 s" in fail["message"] and "stopped answering" in fail["message"]
    # code: 2 runs x 2 arms done; json run 0: baseline done, tree timed out; 11 of 12 would be left
    # after the 5 recorded (4 + baseline + the failed tree run = 6 recorded, 6 left).
    recorded = [r for r in report.runs if r.host == "local"]
    assert len(recorded) == 6 and [r.error is None for r in recorded] == [True] * 5 + [False]
    assert "its 6 remaining run(s) on local were not attempted" in fail["message"]
    assert "healthcheck --hosts local" in fail["message"]
    assert time.monotonic() - t0 < 120
    # Thawed, the server answers again (the module's other tests share it).
    assert httpx.get(f"http://127.0.0.1:{fleet['ports']['tree']}/health", timeout=30).status_code == 200
