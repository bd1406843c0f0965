"""Bad compare arguments exit 2 before any host is contacted (nothing listens on these ports,
so reaching the network would show up as exit 1) and before the report folder is made."""

import json

import pytest
import yaml
from click.testing import CliRunner

from ddtree_ops.cli import cli
from ddtree_ops.compare.run import default_out_dir, plan_hosts
from ddtree_ops.config import parse_project
from ddtree_ops.exceptions import ConfigError

DOC = {
    "hosts": [{"name": "h1", "address": "127.0.0.1"}, {"name": "h2", "address": "127.0.0.1"}],
    "engine": {"target": "lab", "draft": "lab"},
    "services": [
        {"name": "baseline", "algorithm": "dflash", "port": 1031},
        {"name": "tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "port": 1032},
        {"name": "only-h2", "algorithm": "ddtree", "budget": 7, "topk": 4, "port": 1033, "hosts": ["h2"]},
    ],
}


@pytest.fixture
def project_path(tmp_path):
    path = tmp_path / "ddtree.yaml"
    path.write_text(yaml.safe_dump(DOC))
    return path


def _invoke(project_path, *args):
    out = project_path.parent / "report"
    r = CliRunner().invoke(cli, ["-c", str(project_path), "compare", "--out", str(out), *args], catch_exceptions=False)
    return r, out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--runs", "0"], "Invalid value for '--runs'"),
        (["--max-tokens", "1"], "Invalid value for '--max-tokens'"),
        (["--baseline", "tree"], "--baseline and --tree are both 'tree'"),
        (["--tree", "ghost"], "unknown service 'ghost'"),
        (["--hosts", "h9"], "unknown host 'h9'"),
        (["--tree", "only-h2", "--hosts", "h1"], "--hosts: h1 do(es) not run both 'baseline' and 'only-h2'"),
        (["--prompts", "/nonexistent/p.yaml"], "cannot read prompts file"),
        (["--prompts", "held-out"], "built-in sets:"),
        (["--timeout", "-1"], "Invalid value for '--timeout'"),
    ],
)
def test_bad_arguments_exit_2(project_path, args, message):
    r, out = _invoke(project_path, *args)
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert not out.exists()


def test_malformed_prompts_file_exits_2(project_path, tmp_path):
    prompts = tmp_path / "p.yaml"
    prompts.write_text("- name: a\n  text: wrong key\n")
    r, out = _invoke(project_path, "--prompts", str(prompts))
    assert r.exit_code == 2 and "item [0] has unknown key(s) ['text']" in r.output
    assert not out.exists()


def test_missing_project_file_exits_2(tmp_path):
    r = CliRunner().invoke(cli, ["-c", str(tmp_path / "none.yaml"), "compare"], catch_exceptions=False)
    assert r.exit_code == 2 and "no project file" in r.output


def test_plan_hosts_keeps_hosts_running_both():
    project = parse_project(DOC)
    assert [h.name for h in plan_hosts(project, project.service("baseline"), project.service("only-h2"), None)] == ["h2"]
    assert [h.name for h in plan_hosts(project, project.service("baseline"), project.service("tree"), None)] == ["h1", "h2"]
    with pytest.raises(ConfigError):
        plan_hosts(project, project.service("baseline"), project.service("only-h2"), ["h1"])


def test_a_service_that_is_down_exits_1_naming_each_and_writes_nothing(project_path):
    # Nothing listens on 1031/1032: both arms are named, nothing is measured, no report folder appears.
    r, out = _invoke(project_path, "--hosts", "h1", "--runs", "1", "--timeout", "5")
    assert r.exit_code == 1, r.output
    assert "not every service is healthy, so nothing was measured and no report was written" in r.stderr
    assert "h1/baseline: cannot reach http://127.0.0.1:1031/health" in r.stderr
    assert "h1/tree: cannot reach http://127.0.0.1:1032/health" in r.stderr
    assert "warm-up" not in r.output
    assert not out.exists()

    r, out = _invoke(project_path, "--hosts", "h1", "--json")
    assert r.exit_code == 1 and not out.exists()
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["command"] == "compare"
    assert doc["error"]["exit_code"] == 1 and doc["error"]["kind"] == "check"
    assert "h1/tree: cannot reach" in doc["error"]["message"]


def test_default_out_dir_is_timestamped():
    import datetime

    assert default_out_dir(datetime.datetime(2026, 1, 2, 3, 4, 5)) == "ddtree-compare-20260102-030405"


def test_an_unwritable_out_folder_is_refused_before_measuring(tmp_path):
    from click.testing import CliRunner

    from ddtree_ops.cli import cli

    project = tmp_path / "ddtree.yaml"
    project.write_text(
        "hosts: [{name: h1, address: 127.0.0.1, ssh: {port: 1}}]\n"
        "engine: {target: lab, draft: lab}\n"
        "services:\n"
        "  - {name: baseline, algorithm: dflash, port: 39999}\n"
        "  - {name: tree, algorithm: ddtree, budget: 15, topk: 8, port: 39998}\n"
    )
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = CliRunner().invoke(cli, ["-c", str(project), "compare", "--out", str(blocker / "report")],
                                catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert "--out" in result.output and "cannot write" in result.output
