from __future__ import annotations

import re

import yaml
from click.testing import CliRunner

from ddtree_ops.cli import cli
from ddtree_ops.cli.init_cmd import example_project_text
from ddtree_ops.config import Project, load_project


def test_init_writes_an_example_that_validates(tmp_path):
    path = tmp_path / "ddtree.yaml"
    result = CliRunner().invoke(cli, ["init", str(path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    project = load_project(path)
    assert [s.name for s in project.services] == ["baseline", "tree"]
    tree = project.service("tree")
    assert (tree.budget, tree.topk) == (15, 8)


def test_init_refuses_to_overwrite_without_force(tmp_path):
    path = tmp_path / "ddtree.yaml"
    path.write_text("mine\n")
    result = CliRunner().invoke(cli, ["init", str(path)], catch_exceptions=False)
    assert result.exit_code == 2
    assert "already exists" in result.output and "--force" in result.output
    assert path.read_text() == "mine\n"

    result = CliRunner().invoke(cli, ["init", str(path), "--force"], catch_exceptions=False)
    assert result.exit_code == 0
    assert path.read_text() == example_project_text()


def test_example_explains_every_key_it_sets():
    # Each `key:` line that sets a value carries a comment, or a comment line precedes it.
    lines = example_project_text().splitlines()
    unexplained = []
    for i, line in enumerate(lines):
        m = re.match(r"^\s*(?:- )?([a-z_]+):\s*(\S.*)?$", line)
        if not m or line.lstrip().startswith("#"):
            continue
        has_comment = "#" in line or (i > 0 and lines[i - 1].lstrip().startswith("#"))
        is_section = m.group(2) is None or m.group(1) in ("name", "version")
        if not has_comment and not is_section:
            unexplained.append(line.strip())
    assert unexplained == [], unexplained


def test_example_sets_every_top_level_section():
    text = example_project_text()
    document = yaml.safe_load(text)
    # The two API-key sources exclude each other and are optional: the example shows both, commented.
    alternatives = {"api_key_env", "api_key_file"}
    assert set(document) == set(Project.model_fields) - alternatives
    assert all(f"\n# {name}: " in text for name in alternatives)
