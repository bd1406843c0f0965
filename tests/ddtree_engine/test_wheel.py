"""The engine builds into a wheel that works from a fresh venv holding only it and its declared
dependencies (torch constrained to the local CPU build so the test does not fetch a CUDA one)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "engine_patches" / "ddtree_engine"


@pytest.mark.slow
def test_wheel_installs_and_runs_in_a_fresh_venv(tmp_path):
    # Build from a copy: a build leaves egg-info behind, which a PYTHONPATH'd checkout would then
    # report as "already installed".
    source = tmp_path / "src"
    shutil.copytree(ENGINE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(source)],
        check=True, capture_output=True, text=True,
    )
    clean_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    wheels = list(dist.glob("ddtree_engine-*.whl"))
    assert len(wheels) == 1
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("torch==2.13.0\n")
    install = subprocess.run([str(py), "-m", "pip", "install", "-q", "-c", str(constraints), str(wheels[0])],
                             capture_output=True, text=True, env=clean_env)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    help_out = subprocess.run([str(env_dir / "bin" / "ddtree-engine"), "--help"], check=True, capture_output=True, text=True, env=clean_env)
    assert "generate" in help_out.stdout and "make-tiny-pair" in help_out.stdout
    # The built-in lab pair travels inside the wheel.
    gen = subprocess.run(
        [str(env_dir / "bin" / "ddtree-engine"), "generate", "--target", "lab", "--draft", "lab",
         "--prompt-ids", "1,2,3", "--max-new-tokens", "3", "--json"],
        check=True, capture_output=True, text=True, cwd=tmp_path, env=clean_env,
    )
    assert len(json.loads(gen.stdout)["token_ids"]) == 3
