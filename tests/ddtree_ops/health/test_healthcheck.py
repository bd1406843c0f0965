"""Healthcheck's pure parts, and its failures against real endpoints that do not answer."""

import json
import socket
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ddtree_ops.cli import cli
from ddtree_ops.config import parse_project
from ddtree_ops.exceptions import ConfigError
from ddtree_ops.provision.manifest import EnvVerdict, verdict_from_text
from ddtree_ops.health.check import (
    HealthReport,
    HttpFacts,
    deployed_settings,
    evaluate,
    expected_server_info,
    run_healthcheck,
    unit_failures,
)
from ddtree_ops.hosts.query import (
    HostState,
    host_query_command,
    parse_host_query,
    parse_release_query,
    parse_systemctl_show,
    FOLLOW_UP_MARK,
    RELEASE_SCRIPT,
)
from ddtree_ops.hosts.ssh import ssh_argv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def project_doc(ssh_port=22, baseline_port=30001, tree_port=30002):
    return {
        "hosts": [
            {"name": "h1", "address": "127.0.0.1", "ssh": {"port": ssh_port, "key": "~/lab/id_ed25519"}},
            {"name": "h2", "address": "127.0.0.2"},
        ],
        "engine": {"target": "lab", "draft": "lab", "block_size": 16},
        "services": [
            {"name": "baseline", "algorithm": "dflash", "port": baseline_port},
            {"name": "tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "port": tree_port},
        ],
    }


PROJECT = parse_project(project_doc())
TREE = PROJECT.service("tree")
BASELINE = PROJECT.service("baseline")

RUNNING = """Id=ddtree-tree.service
LoadState=loaded
ActiveState=active
SubState=running
NRestarts=0
MainPID=4242
"""
AUTO_RESTART = "LoadState=loaded\nActiveState=activating\nSubState=auto-restart\nNRestarts=3\nMainPID=0\n"
MASKED = "LoadState=masked\nActiveState=inactive\nSubState=dead\nNRestarts=0\nMainPID=0\n"


def test_parse_systemctl_show():
    u = parse_systemctl_show("ddtree-tree.service", RUNNING)
    assert u.running and u.restarts == 0 and u.main_pid == 4242
    k = parse_systemctl_show("ddtree-tree.service", AUTO_RESTART)
    assert not k.running and k.restarts == 3 and k.main_pid is None
    assert k.describe() == "activating/auto-restart"
    assert parse_systemctl_show("u", MASKED).describe() == "masked (inactive)"


def test_host_query_round_trip():
    cmd = host_query_command(["baseline", "tree"])
    assert "systemctl show -p Id,LoadState,ActiveState,SubState,NRestarts,MainPID ddtree-tree.service" in cmd
    assert "/var/lib/ddtree/state.json" in cmd
    out = (
        "### unit ddtree-baseline.service\n" + RUNNING.replace("tree", "baseline")
        + "### unit ddtree-tree.service\n" + AUTO_RESTART
        + '### state.json\n{"services": {"tree": {"release": "r2", "budget": 7, "topk": 4}}}\n'
    )
    facts = parse_host_query(["baseline", "tree"], out)
    assert facts.units["baseline"].running
    assert facts.units["tree"].sub_state == "auto-restart"
    assert facts.state["services"]["tree"]["budget"] == 7
    broken = parse_host_query(["tree"], "### unit ddtree-tree.service\n" + RUNNING + "### state.json\n{nope\n")
    assert broken.state is None and "not valid JSON" in broken.state_error


def _run_release_script(tmp_path, state, releases: dict[str, str], env_key="env", manifest=None):
    """Run the host script with a bare python3 on a layout under tmp_path, as the host does; its output."""
    (tmp_path / "releases").mkdir()
    for rid, text in releases.items():
        (tmp_path / "releases" / rid).mkdir()
        (tmp_path / "releases" / rid / "release.json").write_text(text)
    state_path = tmp_path / "state.json"
    if state is not None:
        state_path.write_text(state if isinstance(state, str) else json.dumps(state))
    if manifest is not None:
        (tmp_path / "env").mkdir()
        (tmp_path / "env" / "abi-manifest.json").write_text(manifest)
    args = [str(state_path), str(tmp_path / "releases"), env_key, "abi-manifest.json", "tree", "baseline", "other"]
    proc = subprocess.run(
        ["python3", "-I", "-", *args], input=RELEASE_SCRIPT.read_text(), capture_output=True, text=True, check=True
    )  # fmt: skip
    return proc.stdout


def test_release_json_of_the_current_release_is_what_was_deployed(tmp_path):
    # The layout deploy writes: state.json names the current release; release.json holds the settings
    # (as Ansible templated them, so numbers may be strings). The host script follows those pointers.
    state = {
        "env": {"path": str(tmp_path / "env")},
        "services": {"tree": {"current": "d1-tree-abc", "previous": "d0-tree-old"}, "baseline": {"current": "d1-baseline-def"}},
    }
    out = _run_release_script(
        tmp_path,
        state,
        {
            "d1-tree-abc": '{"release_id": "d1-tree-abc", "algorithm": "ddtree", "budget": "31", "topk": "4"}\n',
            "d0-tree-old": '{"algorithm": "ddtree", "budget": "15", "topk": "8"}\n',
            "d1-baseline-def": '{"algorithm": "dflash", "budget": "None", "topk": null}\n',
        },
        manifest='{"checks": []}\n',
    )
    assert out.startswith("### releases\n")
    release_text, _, manifest_text = out.partition(FOLLOW_UP_MARK + "\n")
    found = parse_release_query(release_text)
    assert set(found) == {"tree", "baseline"}
    assert deployed_settings(state, "tree", found) == {"algorithm": "ddtree", "budget": 31, "topk": 4}
    assert manifest_text == '{"checks": []}\n'
    expected = expected_server_info(PROJECT, TREE, deployed_settings(state, "tree", found))
    assert (expected["speculative_ddtree_budget"], expected["speculative_ddtree_topk"]) == (31, 4)
    assert expected_server_info(PROJECT, BASELINE, deployed_settings(state, "baseline", found)) == {
        "speculative_algorithm": "DFLASH",
        "speculative_num_draft_tokens": 16,
    }
    assert parse_release_query("### unit tree\nnot json\n") == {}


@pytest.mark.parametrize(
    "state",
    [None, "{nope", '["a list"]', '{"services": {"tree": {"current": "../../etc"}}}', '{"services": {"tree": {"current": "a\\u0000b"}}}'],
)
def test_the_release_script_prints_its_marks_and_nothing_else_when_state_json_is_missing_or_broken(tmp_path, state):
    out = _run_release_script(tmp_path, state, {})
    assert out.startswith("### releases\n") and out.endswith(f"{FOLLOW_UP_MARK}\n")  # no traceback, both marks
    assert parse_release_query(out.partition(FOLLOW_UP_MARK)[0]) == {}


def test_the_release_script_reads_a_manifest_that_is_not_utf8_instead_of_failing(tmp_path):
    state = {"env": {"path": str(tmp_path / "env")}, "services": {}}
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "abi-manifest.json").write_bytes(b'{"x": "\xff"}')
    out = _run_release_script(tmp_path, state, {})
    assert out == f"### releases\n{FOLLOW_UP_MARK}\n" + '{"x": "\ufffd"}\n'


def test_ssh_argv_uses_host_settings():
    argv = ssh_argv(PROJECT.host("h1"), "true")
    assert argv[:3] == ["ssh", "-p", "22"]
    assert "BatchMode=yes" in argv and "StrictHostKeyChecking=yes" in argv
    # a document with no file: the known_hosts beside it is the current folder's
    assert f"UserKnownHostsFile={Path('known_hosts').absolute()}" in argv
    assert argv[argv.index("-i") + 1].endswith("/lab/id_ed25519") and not argv[argv.index("-i") + 1].startswith("~")
    assert argv[-2:] == ["root@127.0.0.1", "true"]
    assert "-i" not in ssh_argv(PROJECT.host("h2"), "true")


def test_expected_info_prefers_what_deploy_recorded():
    assert expected_server_info(PROJECT, TREE, {}) == {
        "speculative_algorithm": "DDTREE",
        "speculative_num_draft_tokens": 16,
        "speculative_ddtree_budget": 15,
        "speculative_ddtree_topk": 8,
    }
    state = {"services": {"tree": {"release": "r2", "budget": 7, "topk": 4}}}
    got = expected_server_info(PROJECT, TREE, deployed_settings(state, "tree"))
    assert got["speculative_ddtree_budget"] == 7 and got["speculative_ddtree_topk"] == 4
    nested = {"services": {"tree": {"current": {"budget": 31, "topk": 2}, "previous": {"budget": 15}}}}
    assert expected_server_info(PROJECT, TREE, deployed_settings(nested, "tree"))["speculative_ddtree_budget"] == 31
    # The baseline's budget is meaningless: only algorithm and block size are checked.
    assert expected_server_info(PROJECT, BASELINE, {}) == {
        "speculative_algorithm": "DFLASH",
        "speculative_num_draft_tokens": 16,
    }
    assert deployed_settings(None, "tree") == {} and deployed_settings({"services": {}}, "tree") == {}


def test_info_mismatches():
    from ddtree_ops.service.server_info import mismatches as info_mismatches

    expected = {"speculative_algorithm": "DDTREE", "speculative_ddtree_budget": 15}
    assert info_mismatches(expected, {"speculative_algorithm": "ddtree", "speculative_ddtree_budget": 15}) == []
    assert info_mismatches(expected, {"speculative_algorithm": "DFLASH", "speculative_ddtree_budget": 7}) == [
        "speculative_algorithm: server says 'DFLASH', deployed 'DDTREE'",
        "speculative_ddtree_budget: server says 7, deployed 15",
    ]


def test_unit_failures():
    fails, warns = unit_failures(parse_systemctl_show("ddtree-tree.service", AUTO_RESTART))
    assert fails == [
        "unit: ddtree-tree.service is activating/auto-restart, expected active/running "
        "(see `journalctl -u ddtree-tree.service` on the host)"
    ]
    assert warns == ["unit: ddtree-tree.service was restarted 3 time(s) by systemd"]
    assert unit_failures(parse_systemctl_show("u", RUNNING)) == ([], [])
    missing = "LoadState=not-found\nActiveState=inactive\nSubState=dead\nNRestarts=0\n"
    assert unit_failures(parse_systemctl_show("ddtree-x.service", missing))[0] == [
        "unit: ddtree-x.service is not installed on the host: run `ddtree-ops deploy`"
    ]


GOOD_INFO = {
    "speculative_algorithm": "DDTREE",
    "speculative_ddtree_budget": 15,
    "speculative_ddtree_topk": 8,
    "speculative_num_draft_tokens": 16,
}
GOOD_GEN = {"choices": [{"text": " Paris"}], "usage": {"completion_tokens": 8}}


def test_evaluate_all_good_and_each_failure():
    host = PROJECT.host("h1")
    facts = HostState(units={"tree": parse_systemctl_show("ddtree-tree.service", RUNNING)}, state={"services": {}})
    ok = evaluate(host, TREE, PROJECT, HttpFacts(200, GOOD_INFO, GOOD_GEN, 1.5, 10.0), facts, None)
    assert ok.ok and ok.generation_tokens == 8 and ok.accept_length == 1.5

    killed = HostState(units={"tree": parse_systemctl_show("ddtree-tree.service", AUTO_RESTART)}, state=None)
    bad = evaluate(
        host,
        TREE,
        PROJECT,
        HttpFacts(200, {**GOOD_INFO, "speculative_ddtree_topk": 2}, {"choices": [], "usage": {"completion_tokens": 0}}),
        killed,
        None,
    )
    assert [f.split(":")[0] for f in bad.failures] == ["unit", "server_info", "generation"]
    assert any("no /var/lib/ddtree/state.json" in w for w in bad.warnings)

    unreachable = evaluate(host, TREE, PROJECT, HttpFacts(200, GOOD_INFO, GOOD_GEN), None, "host h1 is unreachable")
    assert unreachable.failures == ["ssh: host h1 is unreachable"]


def test_the_health_document_says_which_acceptance_it_shows():
    host = PROJECT.host("h1")
    http = HttpFacts(200, GOOD_INFO, GOOD_GEN, 2.25, 10.0, accept_source="verify_committed_tokens")
    result = evaluate(host, TREE, PROJECT, http, None, None)
    doc = HealthReport([result], systemd_checked=False).to_dict()
    assert doc["accept_definition"] == "accept = committed tokens per verify step, prefill excluded"
    (service,) = doc["hosts"][0]["services"]
    assert (service["accept_length"], service["accept_source"]) == (2.25, "verify_committed_tokens")
    assert doc["accept_recent_definition"].startswith("recent = over healthcheck's own 8-token greedy probe")


MANIFEST_FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "manifests" / "h200-manifest.json"


def test_the_env_manifest_verdict_is_shown_and_a_failed_one_fails_the_host():
    host = PROJECT.host("h1")
    facts = HostState(units={"tree": parse_systemctl_show("ddtree-tree.service", RUNNING)}, state={"services": {}})
    http = HttpFacts(200, GOOD_INFO, GOOD_GEN, 1.5, 10.0)

    passed = verdict_from_text("h1", "/opt/ddtree/envs/abc", MANIFEST_FIXTURE.read_text())
    ok = evaluate(host, TREE, PROJECT, http, facts, None, passed)
    assert ok.ok and ok.manifest.short() == "ok"
    document = HealthReport([ok], systemd_checked=True).to_dict()
    assert document["hosts"][0]["manifest"]["status"] == "ok"
    assert document["hosts"][0]["services"][0]["manifest"]["env"] == "/opt/ddtree/envs/abc"
    json.dumps(document)  # one JSON document, nothing unserialisable

    doc = json.loads(MANIFEST_FIXTURE.read_text())
    doc["checks"].append({"name": "pip_check", "status": "fail", "class": "missing-python-dependency", "reason": "transformers requires safetensors, which is not installed"})
    doc["ok"] = False
    failed = evaluate(host, TREE, PROJECT, http, facts, None, verdict_from_text("h1", "/opt/ddtree/envs/abc", json.dumps(doc)))
    assert failed.failures == [
        (
            "manifest: /opt/ddtree/envs/abc failed its ABI manifest: "
            "pip_check — transformers requires safetensors, which is not installed (missing-python-dependency)"
        )
    ]

    missing = evaluate(host, TREE, PROJECT, http, facts, None, EnvVerdict("h1", None, "missing", problem="no env recorded in /var/lib/ddtree/state.json"))
    assert missing.ok and missing.warnings == [
        "manifest: no env recorded in /var/lib/ddtree/state.json: run `ddtree-ops provision h1` to verify the environment"
    ]


def test_filters_are_validated_before_anything_is_touched():
    with pytest.raises(ConfigError, match="unknown host 'nope'"):
        run_healthcheck(PROJECT, ["nope"])
    with pytest.raises(ConfigError, match="unknown service 'nope'"):
        run_healthcheck(PROJECT, None, ["nope"])


@pytest.fixture
def project_file(tmp_path):
    def write(doc):
        path = tmp_path / "ddtree.yaml"
        path.write_text(yaml.safe_dump(doc))
        return str(path)

    return write


def test_cli_bad_filters_exit_2(project_file):
    path = project_file(project_doc())
    r = CliRunner().invoke(cli, ["-c", path, "healthcheck", "--hosts", "h1,nope"], catch_exceptions=False)
    assert r.exit_code == 2 and "unknown host 'nope'" in r.output
    r = CliRunner().invoke(cli, ["-c", path, "healthcheck", "--services", "ghost"], catch_exceptions=False)
    assert r.exit_code == 2 and "unknown service 'ghost'" in r.output
    r = CliRunner().invoke(cli, ["-c", path, "healthcheck", "--timeout", "0"], catch_exceptions=False)
    assert r.exit_code == 2


def test_cli_nothing_listening_exits_1_naming_the_service(project_file):
    # Real sockets with nothing behind them: SSH and HTTP both fail, and the report says which.
    path = project_file(project_doc(ssh_port=free_port(), baseline_port=free_port(), tree_port=free_port()))
    r = CliRunner().invoke(cli, ["-c", path, "healthcheck", "--hosts", "h1", "--timeout", "5"], catch_exceptions=False)
    assert r.exit_code == 1, r.output
    assert "h1/tree: ssh: host h1 (root@127.0.0.1" in r.output and "unreachable over SSH" in r.output
    assert "h1/tree: health: cannot reach http://127.0.0.1:" in r.output
    assert "h1/baseline: health:" in r.output


def test_cli_json_is_one_document_even_on_failure(project_file):
    import json

    path = project_file(project_doc(baseline_port=free_port(), tree_port=free_port()))
    r = CliRunner().invoke(
        cli, ["-c", path, "healthcheck", "--hosts", "h1", "--no-systemd", "--json", "--timeout", "5"], catch_exceptions=False
    )
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["systemd_checked"] is False
    (host,) = doc["hosts"]
    assert host["host"] == "h1" and [s["service"] for s in host["services"]] == ["baseline", "tree"]
    assert all(s["unit"] is None for s in host["services"])
    # The envelope: each failed check is one {host, service, message}.
    assert {(f["host"], f["service"]) for f in doc["failures"]} == {("h1", "baseline"), ("h1", "tree")}
    assert all(f["message"].startswith("health: cannot reach") for f in doc["failures"])


# ---- issue 16: a recent acceptance next to the lifetime one; the JSON envelope ------------------


class CountingEngine:
    """A real HTTP server that keeps SGLang's counters the way the engine does: a long history
    (lifetime acceptance 1.50) and, per completion, 2 verify steps committing 6 of its 7 tokens."""

    def __init__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.counters = {"verify": 100, "committed": 150, "generated": 190, "requests": 40}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, code, body, kind="application/json"):
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                c = outer.counters
                if self.path == "/health":
                    self._send(200, {})
                elif self.path == "/server_info":
                    self._send(200, GOOD_INFO)
                elif self.path == "/v1/models":
                    self._send(200, {"data": [{"id": "lab"}]})
                elif self.path == "/metrics":
                    self._send(200, (
                        f"# TYPE sglang:spec_verify_calls counter\nsglang:spec_verify_calls_total {c['verify']}\n"
                        f"# TYPE ddtree:verify_committed_tokens counter\nddtree:verify_committed_tokens_total {c['committed']}\n"
                        f"# TYPE sglang:generation_tokens counter\nsglang:generation_tokens_total {c['generated']}\n"
                        f"# TYPE sglang:num_requests counter\nsglang:num_requests_total {c['requests']}\n"
                    ), "text/plain; version=0.0.4")
                else:
                    self._send(404, {})

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                c = outer.counters
                c["verify"] += 2
                c["committed"] += 6
                c["generated"] += 7
                c["requests"] += 1
                self._send(200, {"choices": [{"text": " Paris, the capital"}], "usage": {"completion_tokens": 7}})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_healthcheck_shows_a_recent_acceptance_next_to_the_lifetime_one(project_file):
    from json_schemas import validate

    engine = CountingEngine()
    try:
        doc = project_doc(tree_port=engine.port)
        doc["services"] = [s for s in doc["services"] if s["name"] == "tree"]
        path = project_file(doc)
        r = CliRunner().invoke(cli, ["-c", path, "healthcheck", "--hosts", "h1", "--no-systemd", "--json"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        document = validate(json.loads(r.stdout))
        (service,) = document["hosts"][0]["services"]
        # Recent: this probe's own 2 steps committing 6 tokens; lifetime: (150 + 6) / (100 + 2).
        assert service["accept_length_recent"] == 3.0
        assert service["accept_length"] == pytest.approx(156 / 102)
        assert document["command"] == "healthcheck" and document["failures"] == [] and document["warnings"] == []

        table = CliRunner().invoke(cli, ["-c", path, "healthcheck", "--hosts", "h1", "--no-systemd"], catch_exceptions=False)
        assert table.exit_code == 0, table.output
        row = next(line for line in table.stdout.splitlines() if "tree" in line and "h1" in line)
        assert "3.00" in row and "1.56" in row  # lifetime now (162 / 104): this is the second probe
        assert "recent = over healthcheck's own 8-token greedy probe" in " ".join(table.stdout.split())
    finally:
        engine.close()
