"""Which project file a command reads: -c, $DDTREE_CONFIG, ./ddtree.yaml, then the default lab's.

`provision HOST` with an unknown host name is the probe: it loads and validates the project file,
then fails with exit 2 naming the hosts that file lists, before any host is touched.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ddtree_ops.cli import cli
from ddtree_ops.lab.fleet import lab_project
from ddtree_ops.lab.identity import CONFIG_NAME, LAB_DIR_ENV, MARKER


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _project_file(path: Path, host: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(lab_project({host: "127.0.0.1"}, path.parent / "id_ed25519")))
    return path


@pytest.fixture
def places(tmp_path, monkeypatch):
    """An empty working directory, no $DDTREE_CONFIG, and the default lab directory under tmp_path."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("DDTREE_CONFIG", raising=False)
    lab_dir = tmp_path / "lab"
    monkeypatch.setenv(LAB_DIR_ENV, str(lab_dir))
    return cwd, lab_dir


def _lab_made(lab_dir: Path, host: str = "lab-7") -> Path:
    # What `lab up` leaves: the marker and the project file.
    config = _project_file(lab_dir / CONFIG_NAME, host)
    (lab_dir / MARKER).write_text(json.dumps({"made_by": "ddtree-ops lab up"}))
    return config


def test_without_any_project_file_the_error_gives_the_exact_export_line(places):
    _, lab_dir = places
    result = _invoke("provision", "lab-1")
    assert result.exit_code == 2
    assert f"no lab's at {lab_dir / CONFIG_NAME}" in result.stderr
    assert "`export DDTREE_CONFIG=/path/to/ddtree.yaml`" in result.stderr
    assert f"`export DDTREE_CONFIG=DIR/{CONFIG_NAME}`" in result.stderr


def test_after_lab_up_a_plain_command_finds_the_labs_project_file_and_says_so(places):
    _, lab_dir = places
    config = _lab_made(lab_dir)
    result = _invoke("provision", "nosuch")
    # exit 2 from the host name, not from a missing file: the lab's file was loaded and validated
    assert result.exit_code == 2
    assert "unknown host 'nosuch'; the project file lists: lab-7" in result.stderr
    assert f"using the lab's project file {config}" in result.stderr


def test_a_lab_directory_without_its_marker_is_not_used(places):
    _, lab_dir = places
    _project_file(lab_dir / CONFIG_NAME, "lab-7")  # a stray ddtree.yaml, not written by `lab up`
    result = _invoke("provision", "nosuch")
    assert result.exit_code == 2 and "no project file" in result.stderr and "lab-7" not in result.stderr


@pytest.mark.parametrize("winner", ["-c", "$DDTREE_CONFIG", "./ddtree.yaml"])
def test_a_real_project_file_always_wins_over_the_labs(places, monkeypatch, winner):
    cwd, lab_dir = places
    _lab_made(lab_dir)
    args = ["provision", "nosuch"]
    if winner == "-c":
        args = ["-c", str(_project_file(cwd.parent / "elsewhere" / "mine.yaml", "gpu-1")), *args]
    elif winner == "$DDTREE_CONFIG":
        monkeypatch.setenv("DDTREE_CONFIG", str(_project_file(cwd.parent / "elsewhere" / "mine.yaml", "gpu-1")))
    else:
        _project_file(cwd / "ddtree.yaml", "gpu-1")
    result = _invoke(*args)
    assert result.exit_code == 2
    assert "the project file lists: gpu-1" in result.stderr
    assert "using the lab's project file" not in result.stderr


def test_a_lab_made_here_with_dir_is_named_with_its_exact_export_line_but_not_read(places):
    # `lab up --dir ./.lab`, then a plain command in the same folder: the error names that lab's file exactly.
    cwd, _ = places
    config = _lab_made(cwd / ".lab")
    result = _invoke("provision", "nosuch")
    assert result.exit_code == 2 and "no project file" in result.stderr
    assert f"`export DDTREE_CONFIG={config}` (or `-c {config}`)" in result.stderr
    assert "lab-7" not in result.stderr  # named, never loaded: a lab is used only when asked for
