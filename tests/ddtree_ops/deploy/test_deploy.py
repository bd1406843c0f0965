"""plan_deploy (pure), the health gate against real local HTTP servers, and the rollout order.

The Ansible call is replaced at its one seam (`run_playbook=`, or the CLI's `Seams`) by a recorder that
writes what the real playbooks write back to the control node (the host state), and SSH at its one
seam (a `Transport`) by one that answers each host's state.json and stored ABI manifest with the text
of a real manifest; everything else is real.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner

import subprocess

from ddtree_ops.cli import cli
from ddtree_ops.cli.common import Seams
from ddtree_ops.config import parse_project
from ddtree_ops.deploy.outcomes import DeployInterrupted
from ddtree_ops.deploy.outcomes import journal_tail as _journal_tail
from ddtree_ops.deploy.plan import plan_deploy, server_info_mismatches
from ddtree_ops.deploy.rollback import execute_rollback
from ddtree_ops.deploy.rollout import execute_deploy
from ddtree_ops.exceptions import ConfigError, HostError
from ddtree_ops.hosts.layout import STATE_PATH, stored_manifest_path
from ddtree_ops.hosts.ssh import Transport

from manifest_docs import H200_MANIFEST as MANIFEST_FIXTURE
from manifest_docs import failed_manifest_doc
from json_schemas import validate
ENV = "/opt/ddtree/envs/0123456789abcdef"


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def project_doc(ports=(30000, 30001), addresses=("127.0.0.1", "127.0.0.2"), timeout_s=900.0):
    return {
        "hosts": [{"name": f"h{i + 1}", "address": a} for i, a in enumerate(addresses)],
        "engine": {"target": "lab", "draft": "lab", "block_size": 16},
        "services": [
            {"name": "baseline", "algorithm": "dflash", "port": ports[0]},
            {"name": "tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "port": ports[1]},
        ],
        "deploy": {"health_timeout_s": timeout_s, "health_interval_s": 0.05},
    }


# --- plan_deploy -----------------------------------------------------------------------------


def test_overrides_apply_to_the_ddtree_service_only():
    plan = plan_deploy(parse_project(project_doc()), budget=15, topk=4)
    tree = plan.project.service("tree")
    assert (tree.budget, tree.topk) == (15, 4)
    assert plan.project.service("baseline").budget is None
    for host in plan.hosts:
        by_name = {s.service: s for s in host.services}
        assert (by_name["tree"].budget, by_name["tree"].topk) == (15, 4)
        args = by_name["tree"].spec.serve_args
        assert args[args.index("--topk") + 1] == "4"
        assert "--budget" not in by_name["baseline"].spec.serve_args
    assert plan.warnings == []


def test_verify_width_differing_from_block_size_warns_and_explains_the_cost():
    plan = plan_deploy(parse_project(project_doc()), budget=8)
    assert len(plan.warnings) == 1
    warning = plan.warnings[0]
    assert "budget+1 = 9 differs from block size 16" in warning
    assert "not at equal cost" in warning and "--budget 15" in warning


def test_a_threshold_budget_with_sglangs_tree_conv_warns_that_the_first_start_compiles_for_minutes():
    doc = project_doc()
    doc["engine"] = {**doc["engine"], "backend": "sglang", "target": "/models/t", "draft": "/models/d"}
    # By default the engine's tree conv runs (one compile for every budget): no warning at any budget.
    assert not [w for w in plan_deploy(parse_project(doc), budget=256).warnings if "first start" in w]
    for word in ("0", "off", " No "):
        switched = {**doc, "services": [dict(s, env={"DDTREE_SGLANG_TREE_CONV": word}) if s["name"] == "tree" else s
                                        for s in doc["services"]]}
        assert not [w for w in plan_deploy(parse_project(switched), budget=127).warnings if "first start" in w]
        (warning,) = [w for w in plan_deploy(parse_project(switched), budget=128).warnings if "first start" in w]
        assert f"service 'tree': DDTREE_SGLANG_TREE_CONV={word!r} in its env, so at budget 128 (129 verify rows" in warning
        assert "deploy.health_timeout_s = 900s" in warning and "/var/cache/ddtree/tree/triton" in warning
    # Explicitly on: no warning either.
    on = {**doc, "services": [dict(s, env={"DDTREE_SGLANG_TREE_CONV": "on"}) if s["name"] == "tree" else s
                              for s in doc["services"]]}
    assert not [w for w in plan_deploy(parse_project(on), budget=256).warnings if "first start" in w]


def test_selection_by_service_and_host_keeps_project_order():
    plan = plan_deploy(parse_project(project_doc()), services=["tree"], hosts=["h2"])
    assert [h.host for h in plan.hosts] == ["h2"]
    assert [s.service for s in plan.hosts[0].services] == ["tree"]
    assert plan.hosts[0].services[0].base_url == "http://127.0.0.2:30001"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"budget": -1}, "--budget -1"),
        ({"topk": 0}, "--topk 0"),
        ({"services": ["nope"]}, "unknown service 'nope'"),
        ({"hosts": ["h9"]}, "unknown host 'h9'"),
        ({"services": ["baseline"], "budget": 15}, "none is selected"),
    ],
)
def test_bad_input_is_a_config_error(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        plan_deploy(parse_project(project_doc()), **kwargs)


def test_server_info_mismatch_names_each_key():
    plan = plan_deploy(parse_project(project_doc()), budget=15, topk=8)
    tree = next(s for s in plan.hosts[0].services if s.service == "tree")
    ok = {
        "speculative_algorithm": "DDTREE",
        "speculative_ddtree_budget": 15,
        "speculative_ddtree_topk": 8,
        "speculative_num_draft_tokens": 16,
    }
    assert server_info_mismatches(ok, tree) == []
    problems = server_info_mismatches({**ok, "speculative_ddtree_budget": 7}, tree)
    assert problems == ["speculative_ddtree_budget: server says 7, deployed 15"]
    # A drafter whose block size is not the project file's is caught by the gate, not later.
    assert server_info_mismatches({**ok, "speculative_num_draft_tokens": 8}, tree) == [
        "speculative_num_draft_tokens: server says 8, deployed 16"
    ]
    baseline = next(s for s in plan.hosts[0].services if s.service == "baseline")
    assert server_info_mismatches(
        {"speculative_algorithm": "DFLASH", "speculative_ddtree_budget": 15, "speculative_num_draft_tokens": 16},
        baseline,
    ) == []


# --- execution against local servers ------------------------------------------------------------


class FakeService:
    """A real HTTP server answering /health and /server_info the way the engine does."""

    def __init__(self, address: str, port: int, info: dict, healthy: bool = True):
        self.info, self.healthy = info, healthy
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/health":
                    code, body = (200, b"{}") if outer.healthy else (503, b'{"status": "loading"}')
                elif self.path == "/server_info":
                    code, body = 200, json.dumps(outer.info).encode()
                else:
                    code, body = 404, b"{}"
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((address, port), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class RecordingRunner:
    """Stands in for ansible.run_playbook: records the calls, writes back the host state the role reports."""

    def __init__(self):
        self.calls: list[tuple[str, str, dict]] = []
        self.state: dict[str, dict] = {}

    def __call__(self, playbook, project, hosts, extravars, *, on_event=None, log_dir=None):
        (host,) = hosts
        self.calls.append((playbook, host.name, extravars))
        services = self.state.setdefault(host.name, {})
        if playbook == "undeploy.yml":
            # Like the role: forget the named services; Ansible's changed count is 0 when none was there.
            removed = [n for n in extravars["ddtree_deploy_rollback_services"] if services.pop(n, None) is not None]
            return SimpleNamespace(hosts={host.name: SimpleNamespace(changed=2 * len(removed))})
        report_dir = Path(extravars["ddtree_deploy_report_dir"])
        if playbook == "deploy.yml":
            for s in extravars["ddtree_deploy_services"]:
                old = services.get(s["name"], {})
                if old.get("args") == s["serve_args"]:
                    continue  # the same rendered release is already current: the role leaves it alone
                services[s["name"]] = {
                    "current": f"new-{s['name']}",
                    "previous": old.get("current"),
                    "deploy_id": extravars["ddtree_deploy_id"],
                    "args": s["serve_args"],
                }
        elif playbook == "rollback.yml":
            for name in extravars.get("ddtree_deploy_journal_services", []):
                (report_dir / f"{host.name}-{name}.journal").write_text(f"line 1\n{name}: model path does not exist\n")
            after_gate = extravars.get("ddtree_deploy_rollback_deploy_id")
            for name, entry in services.items():
                # After a failed gate: what that rollout installed; by hand: the named ones with a previous release.
                chosen = entry.get("deploy_id") == after_gate if after_gate else (
                    name in extravars["ddtree_deploy_rollback_services"] and entry.get("previous")
                )
                if chosen:
                    services[name] = {
                        "current": entry["previous"],
                        "previous": None,
                        "rolled_back_by": extravars["ddtree_deploy_id"],
                        "rolled_back_from": entry["current"],
                    }
        (report_dir / f"{host.name}.state.json").write_text(json.dumps({"services": services}))

        return SimpleNamespace(hosts={})


@pytest.fixture
def fleet():
    """Two 'hosts' on 127.0.0.1 and 127.0.0.2, each serving baseline and tree."""
    ports = (free_port("127.0.0.1"), free_port("127.0.0.1"))
    servers = {}
    for host, address in (("h1", "127.0.0.1"), ("h2", "127.0.0.2")):
        servers[(host, "baseline")] = FakeService(
            address, ports[0], {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 16}
        )
        servers[(host, "tree")] = FakeService(
            address, ports[1],
            {"speculative_algorithm": "DDTREE", "speculative_ddtree_budget": 15, "speculative_ddtree_topk": 8,
             "speculative_num_draft_tokens": 16},
        )  # fmt: skip
    yield ports, servers
    for server in servers.values():
        server.close()


def test_healthy_rollout_goes_host_by_host(fleet):
    ports, _servers = fleet
    runner = RecordingRunner()
    report = execute_deploy(plan_deploy(parse_project(project_doc(ports))), run_playbook=runner)
    assert report.ok and report.failure is None
    assert [(c[0], c[1]) for c in runner.calls] == [("deploy.yml", "h1"), ("deploy.yml", "h2")]
    assert {c[2]["ddtree_deploy_id"] for c in runner.calls} == {report.deploy_id}
    for host in report.hosts:
        assert host.status == "deployed"
        assert [s.status for s in host.services] == ["healthy", "healthy"]
        assert all(s.healthy_after_s is not None and s.release_changed for s in host.services)
        assert [s.release_id for s in host.services] == ["new-baseline", "new-tree"]


def test_unhealthy_service_rolls_back_its_host_and_stops_the_rollout(fleet):
    ports, servers = fleet
    servers[("h1", "tree")].healthy = False
    runner = RecordingRunner()
    runner.state["h1"] = {"tree": {"current": "old-tree"}, "baseline": {"current": "old-baseline"}}
    plan = plan_deploy(parse_project(project_doc(ports, timeout_s=0.5)))
    report = execute_deploy(plan, run_playbook=runner)

    assert not report.ok
    assert [(c[0], c[1]) for c in runner.calls] == [("deploy.yml", "h1"), ("rollback.yml", "h1")]
    rollback_vars = runner.calls[1][2]
    assert rollback_vars["ddtree_deploy_rollback_deploy_id"] == report.deploy_id
    assert rollback_vars["ddtree_deploy_journal_services"] == ["tree"]
    h1, h2 = report.hosts
    assert h1.status == "rolled back"
    assert {s.service: s.release_id for s in h1.services} == {"baseline": "old-baseline", "tree": "old-tree"}
    assert h2.status == "skipped" and all(s.status == "skipped" for s in h2.services)
    assert "deploy failed on host 'h1'" in report.failure
    assert "service 'tree' (ddtree-tree.service)" in report.failure
    assert "did not answer 200 within 0.5s" in report.failure
    assert "tree: model path does not exist" in report.failure  # the journal tail
    assert "h2 were not touched" in report.failure


def test_server_info_mismatch_fails_the_gate(fleet):
    ports, servers = fleet
    servers[("h1", "tree")].info["speculative_ddtree_topk"] = 2
    runner = RecordingRunner()
    report = execute_deploy(plan_deploy(parse_project(project_doc(ports))), run_playbook=runner)
    assert not report.ok
    tree = next(s for s in report.hosts[0].services if s.service == "tree")
    assert "speculative_ddtree_topk: server says 2, deployed 8" in report.failure
    # It had no previous release: the rollback stops it instead of leaving a wrong service running.
    assert tree.status == "stopped"


# --- the CLI ---------------------------------------------------------------------------------


class HostFiles(Transport):
    """Stands in front of SSH: each host's state.json names ENV, whose stored manifest is `texts[host]`
    (default: a passing one); systemd says every unit runs. Every command is recorded."""

    def __init__(self):
        self.texts: dict[str, str] = {}
        self.commands: list[tuple[str, str]] = []

    def call(self, host, remote_command, *, timeout_s, input_text=None, stdin=None, connect_timeout_s=10):
        self.commands.append((host.name, remote_command))
        if remote_command.startswith(f"cat {STATE_PATH}"):
            out = json.dumps({"env": {"path": ENV}})
        elif stored_manifest_path(ENV) in remote_command:
            out = self.texts.get(host.name, MANIFEST_FIXTURE.read_text())
        elif remote_command.startswith("systemctl show"):
            out = "ActiveState=active\nSubState=running\nNRestarts=0\n"
        else:
            return subprocess.CompletedProcess(remote_command, 1, "", f"unexpected command {remote_command!r}")
        return subprocess.CompletedProcess(remote_command, 0, out, "")

    def open(self, host, remote_command, *, connect_timeout_s=10):
        # The host lock (hosts/lock.py, tested there): granted at once, held until deploy closes the session.
        self.commands.append((host.name, "lock"))
        return subprocess.Popen(["sh", "-c", "echo LOCKED; cat >/dev/null"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)  # fmt: skip


@pytest.fixture
def host_files():
    return HostFiles()


@pytest.fixture
def stored_manifests(host_files):
    """host -> the text of its stored abi-manifest.json, answered by the SSH seam (default: a passing one)."""
    return host_files.texts


@pytest.fixture
def config_file(tmp_path, fleet, host_files):
    ports, _ = fleet
    path = tmp_path / "ddtree.yaml"
    path.write_text(yaml.safe_dump(project_doc(ports, timeout_s=0.5)))
    runner = RecordingRunner()
    return path, runner, Seams(run_playbook=runner, transport=host_files)


def invoke(config_file, *args):
    """`ddtree-ops -c PATH ARGS…` with the test's seams (the recording runner, the host files)."""
    path, _runner, seams = config_file
    return CliRunner().invoke(cli, ["-c", str(path), *args], obj={"seams": seams}, catch_exceptions=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget", "-1"], "--budget -1"),
        (["--topk", "0"], "--topk 0"),
        (["--hosts", "h1,nope"], "unknown host 'nope'"),
        (["--services", "tree,nope"], "unknown service 'nope'"),
    ],
)
def test_cli_bad_input_exits_2_before_touching_a_host(config_file, args, message):
    _path, runner, _seams = config_file
    result = invoke(config_file, "deploy", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert runner.calls == []


def test_cli_json_report_and_exit_codes(config_file, fleet):
    _ports, servers = fleet
    result = invoke(config_file, "deploy", "--budget", "15", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] is True and [h["host"] for h in doc["hosts"]] == ["h1", "h2"]

    servers[("h2", "baseline")].healthy = False
    result = invoke(config_file, "deploy", "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["hosts"][1]["status"] == "rolled back"
    assert "deploy failed on host 'h2'" in result.stderr and "service 'baseline'" in result.stderr


def test_cli_stops_at_a_host_whose_env_failed_its_abi_manifest(config_file, stored_manifests):
    _path, runner, _seams = config_file
    stored_manifests["h2"] = json.dumps(failed_manifest_doc())
    result = invoke(config_file, "deploy", "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert [h["status"] for h in doc["hosts"]] == ["deployed", "refused"]
    assert {s["status"] for s in doc["hosts"][1]["services"]} == {"not deployed"}
    assert "deploy stopped at host 'h2', which was not changed" in result.stderr
    assert f"host 'h2': the engine environment {ENV} failed its ABI manifest" in result.stderr
    assert "import:ddtree_engine.reference.engine — importing ddtree_engine.reference.engine needs the Python module 'safetensors'" in result.stderr
    assert [(c[0], c[1]) for c in runner.calls] == [("deploy.yml", "h1")], "h2 must not be touched"


def test_env_gate_refusal_on_the_first_host_leaves_every_host_untouched(fleet):
    ports, _servers = fleet
    runner = RecordingRunner()
    refusals = {"h1": "host 'h1': the engine environment /opt/ddtree/envs/x has no ABI manifest"}
    report = execute_deploy(plan_deploy(parse_project(project_doc(ports))), run_playbook=runner, env_gate=refusals.get)
    assert not report.ok and runner.calls == []
    assert [h.status for h in report.hosts] == ["refused", "skipped"]
    assert report.hosts[0].error == refusals["h1"]
    assert report.failure.splitlines() == [
        "deploy stopped at host 'h1', which was not changed:",
        refusals["h1"],
        "rollout stopped: host(s) h2 were not touched",
    ]


def test_failed_playbook_rolls_back_that_host_and_reports_ansibles_message(fleet):
    ports, _servers = fleet
    runner = RecordingRunner()

    def failing_on_h1(playbook, project, hosts, extravars, **kw):
        if playbook == "deploy.yml" and hosts[0].name == "h1":
            runner.calls.append((playbook, hosts[0].name, extravars))
            raise HostError("host h1 (127.0.0.1): task 'Verify the unit of tree with systemd-analyze' failed")
        return runner(playbook, project, hosts, extravars, **kw)

    report = execute_deploy(plan_deploy(parse_project(project_doc(ports))), run_playbook=failing_on_h1)
    assert not report.ok
    assert [(c[0], c[1]) for c in runner.calls] == [("deploy.yml", "h1"), ("rollback.yml", "h1")]
    assert "Verify the unit of tree with systemd-analyze" in report.failure
    assert all(s.status == "not deployed" for s in report.hosts[0].services)
    assert report.hosts[1].status == "skipped"


def test_a_unit_systemd_gave_up_on_fails_the_gate_without_waiting_for_the_timeout(fleet):
    ports, servers = fleet
    servers[("h1", "tree")].healthy = False
    asked = []

    def probe(plan):
        asked.append(plan.service)
        return "systemd gave up on ddtree-tree.service (failed/failed after 5 restarts)"

    plan = plan_deploy(parse_project(project_doc(ports, timeout_s=600)))
    started = time.monotonic()
    report = execute_deploy(plan, run_playbook=RecordingRunner(), unit_probe=probe)
    assert time.monotonic() - started < 60
    assert asked == ["tree"], "only services still waiting for /health are probed"
    assert "systemd gave up on ddtree-tree.service" in report.failure


def test_journal_tail_keeps_the_services_own_last_words(tmp_path):
    lines = ["10:00 h ddtree-tree[7]: Error: '/models/x' is not a directory"]
    lines += [f"10:0{i % 10} h systemd[1]: ddtree-tree.service: restart {i}" for i in range(40)]
    (tmp_path / "h-tree.journal").write_text("\n".join(lines) + "\n")
    tail = _journal_tail(tmp_path, "h", "tree").splitlines()
    assert tail[0] == lines[0], "the engine's error must survive systemd's restart chatter"
    assert tail[-1] == lines[-1] and len(tail) == 13
    assert _journal_tail(tmp_path, "h", "baseline") == ""


def test_rollback_gates_restored_services_on_health_alone(fleet):
    """The old release reports its own settings: the gate after a rollback takes a target without
    expected /server_info values (no fake deploy plan), so a disagreeing /server_info does not fail it."""
    ports, servers = fleet
    servers[("h1", "tree")].info["speculative_ddtree_topk"] = 2  # what the previous release was deployed with
    runner = RecordingRunner()
    runner.state["h1"] = {"tree": {"current": "new-tree", "previous": "old-tree"}}
    project = parse_project(project_doc(ports))
    report = execute_rollback(project, services=["tree"], hosts=["h1"], run_playbook=runner)
    assert report.ok, report.failure
    (host,) = report.hosts
    (tree,) = host.services
    assert (host.status, tree.status, tree.release_id) == ("rolled back", "rolled back", "old-tree")
    assert tree.healthy_after_s is not None
    assert [(c[0], c[1]) for c in runner.calls] == [("rollback.yml", "h1")]

    servers[("h1", "tree")].healthy = False
    runner.state["h1"] = {"tree": {"current": "new-tree", "previous": "old-tree"}}
    report = execute_rollback(parse_project(project_doc(ports, timeout_s=0.3)), services=["tree"], hosts=["h1"], run_playbook=runner)
    assert not report.ok and "is not healthy after the rollback" in report.failure


# --- issue 16: honest output, rollback's verdict, undeploy's confirmation, one JSON shape ---------


def test_a_second_identical_deploy_says_up_to_date_and_shows_the_settings(config_file):
    first = invoke(config_file, "deploy", "--budget", "15", "--topk", "8")
    assert first.exit_code == 0, first.output
    assert "installed new releases of baseline (dflash block 16), tree (ddtree budget 15, topk 8, block 16)" in first.stderr
    assert "healthy after" in first.stderr

    again = invoke(config_file, "deploy", "--budget", "15", "--topk", "8")
    assert again.exit_code == 0, again.output
    assert "installing" not in again.stderr and "healthy after" not in again.stderr, again.stderr
    assert "h1: up to date, nothing changed; baseline (dflash block 16), tree (ddtree budget 15, topk 8, block 16) healthy" in again.stderr
    assert "up to date, nothing changed" in again.stdout
    # The table shows what runs, and nothing is cut to 80 columns when stdout is not a terminal.
    row = next(line for line in again.stdout.splitlines() if " tree " in line and "h2" in line)
    assert "unchanged" in row and "ddtree budget 15, topk 8, block 16" in row and "new-tree" in row
    assert max(len(line) for line in again.stdout.splitlines()) > 80 and "…" not in again.stdout

    doc = validate(json.loads(invoke(config_file, "deploy", "--json").stdout))
    assert doc["changed"] is False and doc["failures"] == []
    assert {(s["status"], s["release_changed"]) for h in doc["hosts"] for s in h["services"]} == {("unchanged", False)}
    tree = next(s for s in doc["hosts"][0]["services"] if s["service"] == "tree")
    assert (tree["algorithm"], tree["budget"], tree["topk"], tree["block_size"]) == ("ddtree", 15, 8, 16)


def test_rollback_with_nothing_to_roll_back_exits_1_and_says_why(config_file):
    assert invoke(config_file, "deploy").exit_code == 0  # first releases: nothing before them
    result = invoke(config_file, "rollback", "--hosts", "h1", "--services", "tree")
    assert result.exit_code == 1, result.output
    assert "error: nothing to roll back: tree on h1 has no previous release" in result.stderr

    doc = validate(json.loads(invoke(config_file, "rollback", "--json").stdout))
    assert doc["ok"] is False and doc["changed"] is False
    assert {(f["host"], f["service"]) for f in doc["failures"]} == {(h, s) for h in ("h1", "h2") for s in ("baseline", "tree")}

    assert invoke(config_file, "undeploy", "--hosts", "h1", "--services", "tree").exit_code == 0
    result = invoke(config_file, "rollback", "--hosts", "h1", "--services", "tree")
    assert result.exit_code == 1 and "nothing to roll back: tree on h1 is not deployed" in result.stderr
    doc = validate(json.loads(invoke(config_file, "rollback", "--hosts", "h1", "--json").stdout))
    assert {s["service"]: s["status"] for s in doc["hosts"][0]["services"]} == {
        "baseline": "no previous release", "tree": "not deployed"}


def test_a_real_rollback_reports_the_change(config_file):
    _path, runner, _seams = config_file
    runner.state["h1"] = {"tree": {"current": "new-tree", "previous": "old-tree"}, "baseline": {"current": "b1"}}
    result = invoke(config_file, "rollback", "--hosts", "h1", "--json")
    assert result.exit_code == 0, result.output
    doc = validate(json.loads(result.stdout))
    by_service = {s["service"]: s for s in doc["hosts"][0]["services"]}
    assert doc["ok"] and doc["changed"] is True and doc["operation_id"].startswith("rollback-")
    assert (by_service["tree"]["status"], by_service["tree"]["release_changed"]) == ("rolled back", True)
    assert (by_service["tree"]["release_id"], by_service["tree"]["previous_release_id"]) == ("old-tree", "new-tree")
    # Partly rolled back is a success with a warning for the service that had nothing to go back to.
    assert by_service["baseline"]["status"] == "no previous release"
    assert doc["warnings"] == ["nothing to roll back: baseline on h1 has no previous release"]


def test_undeploy_without_a_selection_needs_all_or_a_confirmation(config_file, monkeypatch):
    _path, runner, _seams = config_file
    assert invoke(config_file, "deploy").exit_code == 0
    deployed_calls = len(runner.calls)

    refused = invoke(config_file, "undeploy")  # CliRunner's stdin is not a terminal
    assert refused.exit_code == 2, refused.output
    assert "removes every service on every host (h1: baseline, tree; h2: baseline, tree)" in refused.stderr
    assert "Pass --all (or --yes)" in refused.stderr and len(runner.calls) == deployed_calls
    both = invoke(config_file, "undeploy", "--all", "--services", "tree")
    assert both.exit_code == 2 and len(runner.calls) == deployed_calls

    monkeypatch.setattr("ddtree_ops.cli.deploy.stdin_is_interactive", lambda: True)
    declined = CliRunner().invoke(cli, ["-c", str(config_file[0]), "undeploy"], input="n\n", obj={"seams": config_file[2]})
    assert declined.exit_code == 2 and "cancelled" in declined.stderr and len(runner.calls) == deployed_calls
    accepted = CliRunner().invoke(cli, ["-c", str(config_file[0]), "undeploy"], input="y\n", obj={"seams": config_file[2]})
    assert accepted.exit_code == 0, accepted.output
    assert "h1: removed baseline, tree" in accepted.stdout and runner.state == {"h1": {}, "h2": {}}

    again = invoke(config_file, "undeploy", "--all")
    assert again.exit_code == 0, again.output
    assert "h1: nothing to remove (baseline, tree not deployed there)" in again.stdout
    assert "nothing to remove: no selected service was deployed on any selected host" in again.stdout
    doc = validate(json.loads(invoke(config_file, "undeploy", "--yes", "--json").stdout))
    assert doc["changed"] is False and [h["status"] for h in doc["hosts"]] == ["nothing to remove"] * 2
    assert doc["hosts"][0]["services"] == [{"service": "baseline", "status": "absent"}, {"service": "tree", "status": "absent"}]


def test_errors_in_json_mode_are_one_json_document(config_file):
    result = invoke(config_file, "deploy", "--hosts", "nope", "--json")
    assert result.exit_code == 2
    doc = validate(json.loads(result.stdout))
    assert doc == {"ok": False, "command": "deploy",
                   "error": {"message": doc["error"]["message"], "exit_code": 2, "kind": "config"}}
    assert "unknown host 'nope'" in doc["error"]["message"] and "unknown host 'nope'" in result.stderr
    usage = invoke(config_file, "undeploy", "--bogus", "--json")
    assert usage.exit_code == 2 and validate(json.loads(usage.stdout))["error"]["kind"] == "usage"
    assert "No such option" in usage.stderr
    # Without --json an error stays a line on stderr, stdout stays empty.
    plain = invoke(config_file, "deploy", "--hosts", "nope")
    assert plain.exit_code == 2 and plain.stdout == ""


def test_ctrl_c_during_a_hosts_playbook_reports_it_interrupted_and_leaves_later_hosts_untouched():
    calls = []

    def interrupted_playbook(playbook, project, hosts, extravars, **_kwargs):
        calls.append((playbook, [h.name for h in hosts]))
        raise KeyboardInterrupt("deploy.yml was cancelled (Ctrl-C)")

    with pytest.raises(DeployInterrupted) as interrupted:  # still a KeyboardInterrupt: a sweep stops on it
        execute_deploy(plan_deploy(parse_project(project_doc())), run_playbook=interrupted_playbook)
    assert isinstance(interrupted.value, KeyboardInterrupt)
    report = interrupted.value.report
    assert calls == [("deploy.yml", ["h1"])], "nothing after the interrupt: no rollback, no second host"
    assert report.ok is False
    assert [h.status for h in report.hosts] == ["interrupted", "skipped"]
    assert "deploy interrupted (Ctrl-C) on host 'h1'" in report.failure
    assert "run the same `ddtree-ops deploy` again to converge" in report.failure
    assert "`ddtree-ops rollback --hosts h1`" in report.failure
    assert "host(s) h2 were not touched" in report.failure
    assert [(f["host"], f["service"]) for f in report.failures] == [("h1", None)]
    validate({"command": "deploy", **report.to_dict()})


def test_cli_key_from_api_key_file_travels_apart_from_the_services_and_stays_out_of_the_report(config_file, monkeypatch):
    # The key reaches Ansible only as the env file's own line: a failing loop task prints its whole item (a
    # service's variables), and that output goes to the log and into the error message.
    path, runner, _seams = config_file
    monkeypatch.setenv("DDTREE_API_KEY", "")
    monkeypatch.delenv("DDTREE_API_KEY")  # restored (unset) at the end, whatever the CLI exports
    key = "sk-planted-from-a-file-42"
    (path.parent / "api.key").write_text(key + "\n")
    (path.parent / "api.key").chmod(0o600)
    document = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**document, "api_key_file": "api.key"}))
    result = invoke(config_file, "deploy", "--json")
    assert result.exit_code == 0, result.output
    deploys = [extravars for playbook, _host, extravars in runner.calls if playbook == "deploy.yml"]
    assert deploys and all(v["ddtree_deploy_api_key_line"] == f'DDTREE_API_KEY="{key}"' for v in deploys)
    assert all(key not in json.dumps(v["ddtree_deploy_services"]) for v in deploys)
    assert key not in result.output
    assert os.environ["DDTREE_API_KEY"] == key, "the gate, healthcheck and compare send it from the environment"
