"""Project-file errors that say where and how to fix (issue 16, point 7).

- a misspelt key gets "did you mean …?", at any depth; a key nowhere near lists the keys allowed there;
- a YAML syntax error names the file, line and column and quotes the line (never `<unicode string>`);
- checks across sections (port clash, unknown GPU index, a GPU pinned on a host that lists none,
  duplicate names, unknown hosts) are reported in the same run as every other error, each under
  the path of the entry at fault (`services[1].port`), never "(top level)".
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from pydantic import ValidationError

from ddtree_ops.cli import cli
from ddtree_ops.config import Project, load_project
from ddtree_ops.exceptions import ConfigError

UUIDS = ["GPU-11111111-1111-1111-1111-111111111111", "GPU-22222222-2222-2222-2222-222222222222"]
GOOD = {
    "hosts": [
        {"name": "gpu-1", "address": "127.0.0.1", "ssh": {"port": 1}, "gpus": list(UUIDS)},
        {"name": "cpu-1", "address": "127.0.0.1", "ssh": {"port": 2}},
    ],
    "engine": {"backend": "reference", "target": "lab", "draft": "lab", "install": {"mode": "venv"}},
    "services": [
        {"name": "baseline", "algorithm": "dflash", "port": 30000, "gpus": [0], "hosts": ["gpu-1"]},
        {"name": "tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "port": 30001, "gpus": [1], "hosts": ["gpu-1"]},
        {"name": "cpu-tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "port": 30000, "hosts": ["cpu-1"]},
    ],
    "deploy": {"health_timeout_s": 600},
}


def problems_of(doc: dict, tmp_path: Path) -> list[str]:
    """The `  - path: message` lines of the ConfigError that loading `doc` from a file raises."""
    path = tmp_path / "ddtree.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as caught:
        load_project(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: "), text
    return [line[4:] for line in text.splitlines() if line.startswith("  - ")]


def changed(*edits) -> dict:
    """GOOD with each (path, value) set; value None deletes the key."""
    doc = copy.deepcopy(GOOD)
    for path, value in edits:
        node = doc
        for key in path[:-1]:
            node = node[key]
        if value is None:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return doc


def test_the_good_document_is_valid(tmp_path):
    path = tmp_path / "ddtree.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    assert [s.name for s in load_project(path).services] == ["baseline", "tree", "cpu-tree"]


# ---- did you mean ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "where, wrong, right",
    [
        (("deploy",), "health_timout_s", "health_timeout_s"),
        (("hosts", 1), "adress", "address"),
        (("hosts", 0, "ssh"), "usr", "user"),
        (("engine", "install"), "mdoe", "mode"),
        (("services", 1), "bugdet", "budget"),
        ((), "servces", "services"),
    ],
)
def test_a_misspelt_key_gets_did_you_mean(tmp_path, where, wrong, right):
    doc = copy.deepcopy(GOOD)
    node = doc
    for key in where:
        node = node[key]
    node[wrong] = node.pop(right, 1)
    location = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in (*where, wrong)).lstrip(".")
    assert f"{location}: unknown key {wrong!r}: did you mean {right!r}?" in problems_of(doc, tmp_path)


def test_a_key_like_no_other_lists_the_keys_allowed_there(tmp_path):
    doc = changed((["deploy", "zzz"], 1))
    assert problems_of(doc, tmp_path) == [
        "deploy.zzz: unknown key 'zzz': remove it or check its spelling; "
        "the keys here are: health_timeout_s, health_interval_s, metrics_log_interval"
    ]


# ---- YAML syntax ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, line, column, problem",
    [
        ("hosts:\n  - name: a\n    address: [1.2.3.4\nengine: {}\n", 4, 7, "expected ',' or ']', but got ':'"),
        ("hosts:\n  - name: a\n\taddress: x\n", 3, 1, "found character '\\t' that cannot start any token"),
        ("engine:\n  target: lab\n draft: lab\n", 3, 2, "expected <block end>, but found '<block mapping start>'"),
    ],
    ids=["unclosed-list", "tab", "bad-indent"],
)
def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path, text, line, column, problem):
    path = tmp_path / "ddtree.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_project(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}:{column}: not valid YAML: {problem}"), message
    assert "<unicode string>" not in message
    quoted = text.splitlines()[line - 1].replace("\t", " ")
    assert f"  {line:>4} | {quoted}\n       | {' ' * (column - 1)}^" in message


def test_the_cli_shows_the_yaml_error_with_exit_2(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("hosts: [\n")
    result = CliRunner().invoke(cli, ["doctor", "-c", str(path)], catch_exceptions=False)
    assert result.exit_code == 2
    assert f"error: {path}:2:1: not valid YAML:" in result.stderr


# ---- checks across sections, reported with everything else ----------------------------------------


def test_a_port_clash_is_reported_with_the_other_errors_under_the_services_path(tmp_path):
    doc = changed((["services", 1, "port"], 30000), (["engine", "blok_size"], 16))
    problems = problems_of(doc, tmp_path)
    assert "engine.blok_size: unknown key 'blok_size': did you mean 'block_size'?" in problems
    assert (
        "services[1].port: port 30000 is used twice on host 'gpu-1' (services 'baseline' and 'tree'); "
        "give each service its own port"
    ) in problems
    assert len(problems) == 2 and not any("(top level)" in p for p in problems)


def test_the_same_port_on_different_hosts_is_fine(tmp_path):
    # cpu-tree uses 30000 like baseline, but on another host: not a clash (GOOD is valid).
    path = tmp_path / "ddtree.yaml"
    path.write_text(yaml.safe_dump(changed((["services", 2, "port"], 30000))))
    assert load_project(path).service("cpu-tree").port == 30000


def test_a_gpu_pinned_on_a_host_that_lists_none_fails_with_the_other_errors(tmp_path):
    doc = changed((["services", 2, "gpus"], [3]), (["services", 0, "algorithm"], "beam"))
    problems = problems_of(doc, tmp_path)
    assert any(p.startswith("services[0].algorithm: Input should be 'ar', 'dflash' or 'ddtree'") for p in problems), problems
    assert (
        "services[2].gpus: pins GPU(s) [3], but host 'cpu-1' lists no GPU: add its GPU UUIDs in index order to "
        "hosts[1].gpus (`nvidia-smi -L` on the host), or remove services[2].gpus"
    ) in problems
    assert len(problems) == 2


def test_a_gpu_index_the_host_does_not_list_fails(tmp_path):
    problems = problems_of(changed((["services", 1, "gpus"], [1, 2])), tmp_path)
    assert problems == [
        "services[1].gpus: GPU index(es) [2] do(es) not exist on host 'gpu-1', which lists 2 GPU(s) (indexes 0..1 of hosts[0].gpus)"
    ]


def test_a_service_on_every_host_is_checked_against_each(tmp_path):
    # No `hosts:` = every host: index 0 exists on gpu-1 but cpu-1 lists no GPU.
    problems = problems_of(changed((["services", 0, "hosts"], None), (["services", 2, "port"], 30002)), tmp_path)
    assert len(problems) == 1 and problems[0].startswith("services[0].gpus: pins GPU(s) [0], but host 'cpu-1' lists no GPU")


def test_duplicate_names_and_unknown_hosts_are_named_by_path(tmp_path):
    doc = changed((["hosts", 1, "name"], "gpu-1"), (["services", 2, "name"], "tree"), (["services", 2, "hosts"], ["gpu-9"]))
    problems = problems_of(doc, tmp_path)
    assert "hosts[1].name: 'gpu-1' appears twice; names must be unique" in problems
    assert "services[2].name: 'tree' appears twice; names must be unique" in problems
    assert "services[2].hosts: unknown host(s) 'gpu-9'; known hosts: ['gpu-1']" in problems


def test_spine_hybrid_mode_on_the_sglang_backend_is_refused_before_any_host(tmp_path):
    # SGLang's worker refuses it on a hybrid target at startup (sglang_plugin/worker.py check_supported): say it here.
    doc = changed((["engine", "backend"], "sglang"), (["engine", "target"], "/models/t"), (["engine", "draft"], "/models/d"),
                  (["engine", "hybrid_mode"], "spine"))
    problems = problems_of(doc, tmp_path)
    assert any("hybrid_mode 'spine' is implemented in the reference backend only" in p and "use hybrid_mode 'safe'" in p
               for p in problems), problems
    # The reference backend takes it: a document wrong elsewhere (a misspelt key) gets that problem only.
    other = problems_of(changed((["deploy", "helth"], 1)), tmp_path)
    assert problems_of(changed((["engine", "hybrid_mode"], "spine"), (["deploy", "helth"], 1)), tmp_path) == other


def test_model_validate_reports_the_same_problems():
    # Code that builds a Project without the file (tests, the lab) gets the same checks.
    with pytest.raises(ValidationError) as caught:
        Project.model_validate(changed((["services", 1, "port"], 30000), (["deploy", "helth"], 1)))
    locations = [e["loc"] for e in caught.value.errors()]
    assert ("services", 1, "port") in locations and ("deploy", "helth") in locations
