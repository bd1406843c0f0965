"""A service's `env:`: checked when the project file loads, written to its env file, named to its container.

The lab run (tests/ddtree_ops/lab/test_deploy_lab.py) reads the values back from the running process.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ddtree_ops import knowledge
from ddtree_ops.cli import cli
from ddtree_ops.config import load_project, parse_project
from ddtree_ops.deploy.units import (
    API_KEY_ENV,
    default_env,
    env_file_values,
    render_env_file,
    unit_environment,
    unit_spec,
)
from ddtree_ops.exceptions import ConfigError
from ddtree_ops.knowledge.service_env import TOOL_SET_ENV

ENGINE_SRC = Path(__file__).resolve().parents[3] / "engine_patches/ddtree_engine/src/ddtree_engine"
UUID = "GPU-8f2b6c1e-0a4d-4f7e-9b1c-2d3e4f5a6b7c"


def document(env, mode: str = "venv", backend: str = "sglang") -> dict:
    return {
        "hosts": [{"name": "gpu-1", "address": "127.0.0.1", "ssh": {"port": 1}, "gpus": [UUID]}],
        "engine": {"backend": backend, "target": "/models/t", "draft": "/models/d", "install": {"mode": mode}},
        "services": [
            {"name": "baseline", "algorithm": "dflash", "port": 30000},
            {"name": "tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "port": 30001, "gpus": [0], "env": env},
        ],
    }


def problems(env, tmp_path, **kw) -> list[str]:
    path = tmp_path / "ddtree.yaml"
    path.write_text(yaml.safe_dump(document(env, **kw)))
    with pytest.raises(ConfigError) as caught:
        load_project(path)
    return [line[4:] for line in str(caught.value).splitlines() if line.startswith("  - ")]


@pytest.mark.parametrize("env, expected", [
    ({"DDTREE_DRAFT_GRAPH_AT_BLOK": "0"},
     "services[1].env.DDTREE_DRAFT_GRAPH_AT_BLOK: DDTREE_DRAFT_GRAPH_AT_BLOK is not a variable the DDTree engine reads: did you mean DDTREE_DRAFT_GRAPH_AT_BLOCK?"),
    ({"ddtree_tree_graph": "0"},
     "services[1].env.ddtree_tree_graph: ddtree_tree_graph is not a variable the DDTree engine reads: names are case-sensitive, did you mean DDTREE_TREE_GRAPH?"),
    ({"DDTREE_QUUX_FROBNICATE": "1"}, "services[1].env.DDTREE_QUUX_FROBNICATE: DDTREE_QUUX_FROBNICATE is not a variable the DDTree engine reads: the engine reads DDTREE_"),
    ({"CUDA_VISIBLE_DEVICES": "1"}, "services[1].env.CUDA_VISIBLE_DEVICES: CUDA_VISIBLE_DEVICES is set by ddtree-ops (the GPUs: set the service's gpus"),
    ({"DDTREE_API_KEY": "k"}, "services[1].env.DDTREE_API_KEY: DDTREE_API_KEY is set by ddtree-ops (the API key: set api_key_env or api_key_file"),
    ({"PYTHONHOME": "/usr"}, "services[1].env.PYTHONHOME: PYTHONHOME would point the service's Python away from its provisioned env"),
    ({"DDTREE_TREE_GRAPH": "maybe"}, "services[1].env.DDTREE_TREE_GRAPH: DDTREE_TREE_GRAPH='maybe' is not one of 1, true, yes, on, 0, false, no, off"),
    ({"DDTREE_KERNELS": "cuda"}, "services[1].env.DDTREE_KERNELS: DDTREE_KERNELS='cuda' is not one of auto, reference, triton"),
    ({"DDTREE_TRACE": "trace.jsonl"}, "services[1].env.DDTREE_TRACE: DDTREE_TRACE='trace.jsonl': give an absolute path on the host"),
    ({"1BAD": "x"}, "services[1].env.1BAD: '1BAD' is not an environment variable name"),
    ({"NOTE": "two\nlines"}, "services[1].env.NOTE: NOTE: values cannot contain newlines or NUL bytes"),
    ({"NOTE": ["a"]}, 'services[1].env.NOTE: YAML read this value as a list; the environment takes text: write it in quotes (NOTE: "…")'),
    ({"NOTE": None}, 'services[1].env.NOTE: YAML read this value as nothing (null); the environment takes text: write it in quotes (NOTE: "")'),
    ({"OMP_NUM_THREADS": 8}, 'services[1].env.OMP_NUM_THREADS: YAML read this value as an int; the environment takes text'),
    ({1: "x"}, "services[1].env: the name 1 is not text"),
])
def test_a_bad_entry_is_refused_under_its_path_with_the_fix(tmp_path, env, expected):
    found = problems(env, tmp_path)
    assert any(p.startswith(expected) for p in found), found


def test_every_bad_entry_is_reported_at_once_with_the_other_errors(tmp_path):
    doc = document({"A": None, "DDTREE_TREE_GRAPH": "maybe", "ddtree_trace": "/t", "NOTE": 3.10, "DDTREE_KERNELS": "triton"})
    doc["services"][0]["port"] = "not a port"
    path = tmp_path / "ddtree.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as caught:
        load_project(path)
    lines = [line[4:].split(":")[0] for line in str(caught.value).splitlines() if line.startswith("  - ")]
    assert sorted(lines) == sorted(["services[0].port", "services[1].env.A", "services[1].env.DDTREE_TREE_GRAPH",
                                    "services[1].env.ddtree_trace", "services[1].env.NOTE"])
    assert str(caught.value).splitlines()[0].endswith("5 problem(s) in the project file:")


@pytest.mark.parametrize("env, kw, expected", [
    ({"DDTREE_DRAFT_GRAPH_AT_BLOCK": "0"}, {"backend": "reference"},
     "services[1].env.DDTREE_DRAFT_GRAPH_AT_BLOCK: DDTREE_DRAFT_GRAPH_AT_BLOCK is read by the sglang backend only; with engine.backend reference it would do nothing"),
    ({"DDTREE_TRACE": "/var/tmp/trace.jsonl"}, {"mode": "container"},
     "services[1].env.DDTREE_TRACE: DDTREE_TRACE: in container mode the file would be written inside the container"),
    ({"DOCKER_HOST": "tcp://x:2375"}, {"mode": "container"},
     "services[1].env.DOCKER_HOST: DOCKER_HOST: in container mode the env file also reaches the unit's own docker commands"),
])
def test_entries_that_would_do_nothing_or_harm_for_this_backend_or_mode_are_refused(tmp_path, env, kw, expected):
    found = problems(env, tmp_path, **kw)
    assert any(p.startswith(expected) for p in found), found


def test_the_same_entries_are_fine_where_they_apply():
    parse_project(document({"DDTREE_DRAFT_GRAPH_AT_BLOCK": "0", "DDTREE_TRACE": "/var/tmp/trace.jsonl", "DOCKER_HOST": "x"}))
    parse_project(document({"DDTREE_KERNELS": "reference"}, backend="reference", mode="container"))


def test_the_cli_refuses_a_bad_env_with_exit_2_before_any_host(tmp_path):
    path = tmp_path / "ddtree.yaml"
    path.write_text(yaml.safe_dump(document({"DDTREE_TRACE_PATH": "/tmp/t"})))
    # Port 1 on the loopback: any SSH attempt would fail with exit 1, not 2.
    result = CliRunner().invoke(cli, ["-c", str(path), "deploy"])
    assert result.exit_code == 2, result.output
    assert "services[1].env.DDTREE_TRACE_PATH: DDTREE_TRACE_PATH is not a variable the DDTree engine reads: did you mean DDTREE_TRACE?" in result.output


def test_a_switch_written_bare_stands_for_its_word_and_other_text_stays_verbatim(tmp_path):
    path = tmp_path / "ddtree.yaml"
    # YAML 1.1 reads `off` as false and `0` as an int: for the engine's switches they mean their words.
    path.write_text(yaml.safe_dump(document({})).replace(
        "env: {}", "env: {DDTREE_TREE_GRAPH: off, DDTREE_DRAFT_GRAPH_AT_BLOCK: 0, OMP_NUM_THREADS: '8', PY: '3.10'}"))
    env = load_project(path).service("tree").env
    assert env == {"DDTREE_TREE_GRAPH": "false", "DDTREE_DRAFT_GRAPH_AT_BLOCK": "0", "OMP_NUM_THREADS": "8", "PY": "3.10"}


def test_the_env_file_holds_the_service_env_after_ddtree_ops_own():
    env = {"NOTE": 'a "quoted" $HOME value\\', "DDTREE_DRAFT_GRAPH_AT_BLOCK": "0", "NCCL_DEBUG": "INFO"}
    project = parse_project(document(env))
    spec = unit_spec(project.service("tree"), project.host("gpu-1"), project.engine, metrics_log_interval=32)
    text = render_env_file(spec)
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines[:3] == ['PYTHONUNBUFFERED="1"', 'HF_HUB_OFFLINE="1"', 'DDTREE_SERVICE="tree"']
    assert lines[3:] == ['DDTREE_DRAFT_GRAPH_AT_BLOCK="0"', 'NCCL_DEBUG="INFO"', 'NOTE="a \\"quoted\\" $HOME value\\\\"',
                         'TRITON_CACHE_DIR="/var/cache/ddtree/tree/triton"']
    # Sorted: the same entries in another order are the same file (no new release, no restart).
    reordered = parse_project(document(dict(reversed(list(env.items())))))
    again = unit_spec(reordered.service("tree"), reordered.host("gpu-1"), reordered.engine, metrics_log_interval=32)
    assert render_env_file(again) == text
    baseline = unit_spec(project.service("baseline"), project.host("gpu-1"), project.engine, metrics_log_interval=32)
    assert "NCCL_DEBUG" not in render_env_file(baseline)


def test_a_container_is_told_the_names_of_the_service_env():
    project = parse_project(document({"NCCL_DEBUG": "INFO"}, mode="container"))
    spec = unit_spec(project.service("tree"), project.host("gpu-1"), project.engine, metrics_log_interval=32)
    args = spec.container_args
    assert [args[i + 1] for i, a in enumerate(args) if a == "-e"] == [
        "PYTHONUNBUFFERED", "HF_HUB_OFFLINE", "DDTREE_SERVICE", "NCCL_DEBUG", "TRITON_CACHE_DIR"]


def test_triton_compiles_into_the_service_cache_directory_unless_env_says_otherwise():
    """A start compiles every Triton kernel it meets for the first time (SGLang's tree verify some per verify
    width: minutes at budget 128 on an H100): TRITON_CACHE_DIR in the unit's CacheDirectory= keeps them for the
    next start; in container mode that directory is mounted at the same path, read-write. A service's own
    TRITON_CACHE_DIR wins."""
    for mode in ("venv", "container"):
        project = parse_project(document({}, mode=mode))
        spec = unit_spec(project.service("tree"), project.host("gpu-1"), project.engine, metrics_log_interval=32)
        assert spec.env_file["TRITON_CACHE_DIR"] == "/var/cache/ddtree/tree/triton"
        assert spec.as_vars()["cache_directory"] == "ddtree/tree"
        mounts = [spec.container_args[i + 1] for i, a in enumerate(spec.container_args) if a == "-v"]
        assert mounts[:1] == (["/var/cache/ddtree/tree:/var/cache/ddtree/tree"] if mode == "container" else [])
    project = parse_project(document({"TRITON_CACHE_DIR": "/scratch/triton"}))
    assert env_file_values(project.service("tree"))["TRITON_CACHE_DIR"] == "/scratch/triton"
    assert env_file_values(project.service("baseline"))["TRITON_CACHE_DIR"] == "/var/cache/ddtree/baseline/triton"


def test_every_variable_ddtree_ops_sets_is_refused_in_env():
    project = parse_project(document({}))
    service = project.service("tree")
    ours = set(env_file_values(service)) - set(default_env(service.name)) | set(unit_environment([UUID])) | {API_KEY_ENV}
    assert ours == set(TOOL_SET_ENV)
    assert not set(default_env(service.name)) & set(TOOL_SET_ENV), "a default is the service's to override"


def test_the_known_engine_variables_are_the_ones_the_engine_reads():
    """knowledge/engine_env.yaml against the engine's source: every DDTREE_ name the engine names (its
    API key aside, which ddtree-ops sets), no more, no less."""
    named = set()
    for path in ENGINE_SRC.rglob("*.py"):
        named |= set(re.findall(r'"(DDTREE_[A-Z_]+)"', path.read_text()))
    assert named - {API_KEY_ENV} == set(knowledge.engine_env())


def test_the_switch_words_are_the_engines():
    """The on/off words the project file accepts are exactly those prep.env_switch reads as explicit."""
    prep = pytest.importorskip("ddtree_engine.sglang_plugin.prep")
    known = knowledge.engine_env()
    for name in (prep.GRAPH_ENV, prep.DRAFT_GRAPH_ENV):
        words = known[name]["values"]
        mp = pytest.MonkeyPatch()
        try:
            for word in words:
                mp.setenv(name, word)
                # An explicit word gives the same answer whatever the default.
                assert prep.env_switch(name, True) == prep.env_switch(name, False), (name, word)
            # And the engine reads no explicit word the project file would refuse: any text that is not one
            # of the words leaves both defaults as they are.
            for other in ("2", "enable", "disabled", "y", "n", "none", ""):
                assert other not in words
                mp.setenv(name, other)
                assert (prep.env_switch(name, True), prep.env_switch(name, False)) == (True, False), (name, other)
        finally:
            mp.undo()
