"""Help that teaches (issue 16, point 9): every `--help` has examples and exit codes, every option says
what it does, commands are listed in the order of the flow, and commands suggest the next step.

The walk covers every command the CLI registers, so a new command without examples fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from ddtree_ops.cli import cli

FLOW = ["init", "lab", "hosts", "doctor", "provision", "deploy", "healthcheck", "compare", "sweep", "rollback", "undeploy"]
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"


def command_paths(group: click.Group = cli, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path, the root's () included: (), ("init",), ("lab",), ("lab", "up"), …"""
    paths = [prefix]
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            paths += command_paths(command, prefix + (name,))
        else:
            paths.append(prefix + (name,))
    return paths


PATHS = command_paths()


def _command(path: tuple[str, ...]) -> click.Command:
    command: click.Command = cli
    for name in path:
        command = command.commands[name]
    return command


def test_the_walk_finds_every_command():
    assert {p[0] for p in PATHS if p} == set(FLOW)
    assert ("lab", "up") in PATHS and ("lab", "down") in PATHS and len(PATHS) == 1 + len(FLOW) + 3 + 1  # lab up|status|down, hosts trust


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "ddtree-ops")
def test_every_help_has_examples_and_exit_codes(invoke, path):
    result = invoke(*path, "--help")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "Examples:" in text, f"`{' '.join(path)} --help` has no Examples: section"
    assert "Exit codes:" in text, f"`{' '.join(path)} --help` has no Exit codes: section"
    examples = text.split("Examples:", 1)[1]
    name = " ".join(("ddtree-ops", *path))
    assert name in examples, f"no example of `{name}` under Examples:"
    codes = text.split("Exit codes:", 1)[1]
    assert "0  " in codes, f"`{name} --help`: exit code 0 is not explained"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "ddtree-ops")
def test_every_option_has_a_description(path):
    command = _command(path)
    bare = [
        "/".join(p.opts) for p in command.get_params(click.Context(command)) if isinstance(p, click.Option) and not (p.help or "").strip()
    ]
    assert bare == [], f"`{' '.join(path)}`: options without help text: {bare}"


def test_commands_are_listed_in_the_order_of_the_flow(invoke):
    assert cli.list_commands(click.Context(cli)) == FLOW
    assert _listed(invoke("--help").stdout) == FLOW
    assert _listed(invoke("lab", "--help").stdout) == ["up", "status", "down"]


def _listed(help_text: str) -> list[str]:
    # The first word of each line of the Commands: section, up to the next blank line.
    section = help_text.split("Commands:\n", 1)[1].split("\n\n", 1)[0]
    return [line.split()[0] for line in section.splitlines() if line.startswith("  ") and line.strip()]


def test_init_suggests_doctor_and_provision_plan(places, invoke):
    result = invoke("init")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    doctor = next(i for i, line in enumerate(lines) if line.strip().startswith("ddtree-ops doctor"))
    plan = next(i for i, line in enumerate(lines) if line.strip().startswith("ddtree-ops provision --plan"))
    assert doctor < plan
    named = invoke("init", "elsewhere.yaml")
    assert "ddtree-ops -c elsewhere.yaml doctor" in named.stdout
    assert "ddtree-ops -c elsewhere.yaml provision --plan" in named.stdout


def test_a_plan_that_fits_suggests_provision(places, invoke, write_project, project_doc, closed_port):
    config = str(write_project(project_doc({"h1": closed_port(), "h2": closed_port()})))
    facts = str(FIXTURES / "cpu-only-probe.json")
    result = invoke("-c", config, "provision", "--plan", "--hosts", "h2", "--facts", facts)
    assert result.exit_code == 0, result.output
    assert f"next: ddtree-ops -c {config} provision --hosts h2" in result.stderr
    as_json = invoke("-c", config, "provision", "--plan", "--hosts", "h2", "--facts", facts, "--json")
    assert "next:" not in as_json.stderr and json.loads(as_json.stdout)["ok"] is True
    unreachable = invoke("-c", config, "provision", "--plan", "--hosts", "h1,h2")
    assert unreachable.exit_code == 1 and "next:" not in unreachable.stderr
