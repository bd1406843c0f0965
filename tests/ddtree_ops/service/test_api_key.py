"""Where the API key comes from (`api_key_env` / `api_key_file` / $DDTREE_API_KEY), checked before any host."""

from __future__ import annotations

import os

import pytest
import yaml
from click.testing import CliRunner

from ddtree_ops.cli import cli
from ddtree_ops.cli.common import Seams
from ddtree_ops.config import parse_project
from ddtree_ops.exceptions import ConfigError
from ddtree_ops.hosts.ssh import Transport
from ddtree_ops.service.api_key import API_KEY_ENV, resolve_api_key

KEY = "sk-planted-0123456789"
DOC = {
    "hosts": [{"name": "gpu-1", "address": "10.0.0.11"}],
    "engine": {"target": "lab", "draft": "lab"},
    "services": [{"name": "tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "port": 30001}],
}


@pytest.fixture(autouse=True)
def _no_key_in_the_environment(monkeypatch):
    for name in (API_KEY_ENV, "PROD_KEY"):  # set first, so that the test's end restores whatever the CLI exports
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def project(**keys):
    return parse_project({**DOC, **keys})


def key_file(path, text=KEY + "\n", mode=0o600):
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_default_is_the_callers_ddtree_api_key(monkeypatch):
    assert resolve_api_key(project()) is None
    monkeypatch.setenv(API_KEY_ENV, KEY)
    assert resolve_api_key(project()) == KEY


def test_api_key_env_names_the_variable(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "not this one")
    monkeypatch.setenv("PROD_KEY", KEY)
    assert resolve_api_key(project(api_key_env="PROD_KEY")) == KEY
    monkeypatch.delenv("PROD_KEY")
    with pytest.raises(ConfigError, match=r"api_key_env: \$PROD_KEY is not set \(or empty\) in this shell: export it"):
        resolve_api_key(project(api_key_env="PROD_KEY"))


def test_api_key_file_is_relative_to_the_project_files_folder(tmp_path):
    key_file(tmp_path / "api.key")
    assert resolve_api_key(project(api_key_file="api.key"), tmp_path) == KEY
    assert resolve_api_key(project(api_key_file=str(tmp_path / "api.key")), "/") == KEY


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: None, r"api_key_file: .*api.key does not exist: write the key there \(chmod 600\)"),
        (lambda p: key_file(p, mode=0o644), r"is open to other users \(mode 0644\).*chmod 600 .*api.key"),
        (lambda p: key_file(p, mode=0o640), r"is open to other users \(mode 0640\)"),
        (lambda p: p.mkdir(), r"is not a regular file"),
        (lambda p: key_file(p, text="\n"), r"is empty: put the API key in it"),
        (lambda p: key_file(p, text="one\ntwo\n"), r"holds more than one line"),
    ],
    ids=["missing", "world-readable", "group-readable", "a-directory", "empty", "two-lines"],
)
def test_a_bad_key_file_is_a_config_error(tmp_path, make, message):
    make(tmp_path / "api.key")
    with pytest.raises(ConfigError, match=message):
        resolve_api_key(project(api_key_file="api.key"), tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_key_file_is_a_config_error(tmp_path):
    key_file(tmp_path / "api.key", mode=0o000)
    with pytest.raises(ConfigError, match="cannot be read"):
        resolve_api_key(project(api_key_file="api.key"), tmp_path)


def test_the_project_file_names_one_source_and_never_the_key_itself():
    with pytest.raises(ConfigError, match="api_key_env and api_key_file both name the API key: keep one"):
        project(api_key_env="PROD_KEY", api_key_file="api.key")
    with pytest.raises(ConfigError, match=r"api_key_env: String should match pattern"):
        project(api_key_env="sk-this-is-a-key")


class Untouchable(Transport):
    def call(self, *args, **kwargs):
        raise AssertionError("a host was contacted")

    def open(self, *args, **kwargs):
        raise AssertionError("a host was contacted")


def _no_playbook(*args, **kwargs):
    raise AssertionError("a playbook ran")


# The commands that use the key: deploy writes it into the hosts' env files; the others send it.
KEY_COMMANDS = [["deploy"], ["healthcheck"], ["compare"], ["rollback"], ["sweep", "--budgets", "15"]]


@pytest.mark.parametrize("command", KEY_COMMANDS)
def test_every_command_that_uses_the_key_refuses_a_key_file_open_to_others_before_touching_a_host(tmp_path, command):
    key_file(tmp_path / "api.key", mode=0o644)
    config = tmp_path / "ddtree.yaml"
    config.write_text(yaml.safe_dump({**DOC, "api_key_file": "api.key"}))
    seams = Seams(run_playbook=_no_playbook, transport=Untouchable())
    result = CliRunner().invoke(cli, ["-c", str(config), *command, "--json"], obj={"seams": seams})
    assert result.exit_code == 2, result.output
    assert "is open to other users (mode 0644)" in result.stderr and KEY not in result.output


@pytest.mark.parametrize("command", KEY_COMMANDS)
def test_a_command_that_uses_the_key_refuses_an_unset_api_key_env(tmp_path, command):
    config = tmp_path / "ddtree.yaml"
    config.write_text(yaml.safe_dump({**DOC, "api_key_env": "PROD_KEY"}))
    seams = Seams(run_playbook=_no_playbook, transport=Untouchable())
    result = CliRunner().invoke(cli, ["-c", str(config), *command, "--json"], obj={"seams": seams})
    assert result.exit_code == 2, result.output
    assert "api_key_env: $PROD_KEY is not set" in result.stderr


@pytest.mark.parametrize("command", [["provision"], ["doctor"], ["undeploy", "--all", "--yes"]])
def test_commands_that_never_use_the_key_run_without_it(tmp_path, command):
    """provision, doctor and undeploy send no request to a service and write no key: an operator
    who has not exported the key yet can still build envs, check hosts and remove services."""
    config = tmp_path / "ddtree.yaml"
    config.write_text(yaml.safe_dump({**DOC, "api_key_env": "PROD_KEY"}))
    seams = Seams(run_playbook=_no_playbook, transport=Untouchable())
    result = CliRunner().invoke(cli, ["-c", str(config), *command], obj={"seams": seams})
    assert "PROD_KEY" not in result.output
    # Past the project file, the command went for the host (the test's transport and playbook runner refuse it).
    assert isinstance(result.exception, AssertionError), result.output
    assert str(result.exception) in ("a host was contacted", "a playbook ran")
