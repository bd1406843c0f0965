"""One set of flags on every command (issue 16, point 2).

- `--hosts H1,H2` (repeatable, comma lists) on doctor and provision, as on the other commands; host
  names as arguments still work for one release, with a deprecation note on stderr;
- `-c/--config FILE` before or after the command name, on every command that reads the project file,
  with the same precedence (over $DDTREE_CONFIG and ./ddtree.yaml) either way.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from ddtree_ops.cli import READS_PROJECT, cli

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"
CPU_FACTS = str(FIXTURES / "cpu-only-probe.json")


# ---- --hosts -----------------------------------------------------------------------------------


def test_provision_takes_hosts_as_an_option(places, invoke, write_project, project_doc, closed_port):
    config = str(write_project(project_doc({"lab-1": closed_port(), "lab-2": closed_port()})))
    result = invoke("provision", "--hosts", "lab-1", "--plan", "--facts", CPU_FACTS, "--json", "-c", config)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [h["host"] for h in doc["hosts"]] == ["lab-1"] and doc["hosts"][0]["ok"] is True
    assert "deprecated" not in result.stderr


@pytest.mark.parametrize("form", [["--hosts", "lab-2,lab-1"], ["--hosts", "lab-2", "--hosts", "lab-1"]], ids=["comma", "repeated"])
def test_provision_plan_hosts_comma_list_or_repeated_selects_both_in_project_order(places, invoke, write_project, project_doc, closed_port, form):
    config = str(write_project(project_doc({"lab-1": closed_port(), "lab-2": closed_port(), "lab-3": closed_port()})))
    result = invoke("-c", config, "provision", "--plan", "--json", *form)
    assert result.exit_code == 1, result.output  # both unreachable: closed ports
    hosts = json.loads(result.stdout)["hosts"]
    assert [h["host"] for h in hosts] == ["lab-1", "lab-2"]
    assert all("unreachable over SSH" in h["error"] for h in hosts)


def test_doctor_takes_hosts_as_an_option(places, invoke, write_project, project_doc, closed_port):
    config = str(write_project(project_doc({"a": closed_port(), "b": closed_port()})))
    result = invoke("-c", config, "doctor", "--hosts", "b", "--no-manifest", "--json")
    assert result.exit_code == 1, result.output
    scopes = {c["scope"] for c in json.loads(result.stdout)["checks"]}
    assert scopes == {"control", "b"}


@pytest.mark.parametrize("command", ["doctor", "provision"])
def test_an_unknown_host_in_hosts_is_bad_input(places, invoke, write_project, project_doc, closed_port, command):
    config = str(write_project(project_doc({"a": closed_port()})))
    result = invoke("-c", config, command, "--hosts", "a,nosuch")
    assert result.exit_code == 2, result.output
    assert "unknown host 'nosuch'; the project file lists: a" in result.stderr


@pytest.mark.parametrize("command", ["doctor", "provision"])
def test_positional_hosts_still_work_with_a_deprecation_note(places, invoke, write_project, project_doc, closed_port, command):
    config = str(write_project(project_doc({"a": closed_port(), "b": closed_port()})))
    extra = ["--plan"] if command == "provision" else ["--no-manifest"]
    result = invoke("-c", config, command, "b", *extra, "--json")
    assert result.exit_code == 1, result.output
    assert f"deprecated: `{command} b` — name hosts with `{command} --hosts b`" in result.stderr
    doc = json.loads(result.stdout)
    names = [h["host"] for h in doc["hosts"]] if command == "provision" else sorted({c["scope"] for c in doc["checks"]} - {"control"})
    assert names == ["b"]


def test_every_hosts_option_is_a_repeatable_list_of_names():
    # One spelling everywhere: `--hosts a,b` and `--hosts a --hosts b` (lab up's --hosts N is a count).
    single = []
    for name, command in cli.commands.items():
        for param in command.params:
            if isinstance(param, click.Option) and "--hosts" in param.opts and not param.multiple:
                single.append(name)
    assert single == [], f"--hosts takes one value only on: {single} (use cli.common.hosts_option)"


def test_the_deprecated_argument_is_not_advertised(invoke):
    for command in ("doctor", "provision"):
        usage = invoke(command, "--help").stdout.splitlines()[0]
        assert usage == f"Usage: ddtree-ops {command} [OPTIONS]", usage


# ---- -c before or after the command --------------------------------------------------------------


def _misspelt(write_project, project_doc) -> Path:
    # A file only this test writes, with a mistake only it has: the error proves which file was read.
    doc = project_doc({"h1": 22})
    doc["deploy"] = {"health_timout_s": 5}
    return write_project(doc, "misspelt.yaml")


@pytest.mark.parametrize("command", READS_PROJECT)
@pytest.mark.parametrize("where", ["after", "before"])
def test_every_command_takes_c_before_or_after_its_name(places, invoke, write_project, project_doc, command, where):
    config = str(_misspelt(write_project, project_doc))
    args = [command, "-c", config] if where == "after" else ["-c", config, command]
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert f"{config}: 1 problem(s) in the project file" in result.stderr
    assert "deploy.health_timout_s: unknown key 'health_timout_s': did you mean 'health_timeout_s'?" in result.stderr


def test_every_command_that_reads_the_project_file_is_listed(invoke):
    # READS_PROJECT is what gets -c; a new command that calls project_from must be added to it.
    with_c = {name for name, cmd in cli.commands.items() if any(p.name == "config_path" for p in cmd.params)}
    assert with_c == set(READS_PROJECT) | {"init"}


@pytest.mark.parametrize("loser", ["$DDTREE_CONFIG", "./ddtree.yaml"])
def test_c_after_the_command_has_the_same_precedence_as_before(places, invoke, write_project, project_doc, monkeypatch, loser):
    mine = str(write_project(project_doc({"mine": 22}), "mine.yaml"))
    other = project_doc({"other": 22})
    if loser == "$DDTREE_CONFIG":
        monkeypatch.setenv("DDTREE_CONFIG", str(write_project(other, "other.yaml")))
    else:
        write_project(other, "other.yaml").rename(places / "ddtree.yaml")
    for args in (["doctor", "-c", mine, "--hosts", "nosuch"], ["-c", mine, "doctor", "--hosts", "nosuch"]):
        result = invoke(*args)
        assert result.exit_code == 2 and "the project file lists: mine" in result.stderr, (args, result.output)


def test_doctor_c_file_runs_the_checks(places, invoke, write_project, project_doc, closed_port):
    port = closed_port()
    config = str(write_project(project_doc({"h1": port})))
    assert invoke("doctor").exit_code == 2  # no project file anywhere: this fixture's cwd is empty
    result = invoke("doctor", "-c", config, "--no-manifest")
    assert result.exit_code == 1, result.output
    assert f"FAIL  h1             reachable      unreachable over SSH (root@127.0.0.1:{port})" in result.stdout


def test_two_different_files_are_a_usage_error(places, invoke, write_project, project_doc):
    a = str(write_project(project_doc({"a": 22}), "a.yaml"))
    b = str(write_project(project_doc({"b": 22}), "b.yaml"))
    result = invoke("-c", a, "doctor", "-c", b)
    assert result.exit_code == 2
    assert f"-c/--config given twice with different files ({a} and {b})" in result.stderr
    same = invoke("-c", a, "doctor", "-c", a, "--hosts", "nosuch")
    assert same.exit_code == 2 and "the project file lists: a" in same.stderr


def test_init_writes_the_file_c_names(places, invoke):
    result = invoke("init", "-c", "mine.yaml")
    assert result.exit_code == 0, result.output
    assert (places / "mine.yaml").exists() and not (places / "ddtree.yaml").exists()
    assert invoke("-c", "b.yaml", "init", "c.yaml").exit_code == 2  # two names for one file
    assert not (places / "b.yaml").exists() and not (places / "c.yaml").exists()
