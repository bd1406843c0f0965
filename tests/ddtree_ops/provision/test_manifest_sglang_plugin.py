"""The manifest's `sglang_plugin` check, against real installed metadata.

An env is assembled in a temporary site directory: the real sglang 0.5.23 distribution's metadata (copied
from wherever sglang is installed: this interpreter, or $DDTREE_SGLANG_PYTHON's) and the real engine wheel
built from engine_patches/ddtree_engine (`pip install --no-deps --target`), each present or not. The check
then runs in a fresh interpreter that sees that directory only (`python -S`), through importlib.metadata as
it does on a host. Skipped with the reason when no sglang is installed anywhere here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
HOST_SCRIPTS = REPO / "ddtree_ops" / "host_scripts"
ENGINE = REPO / "engine_patches" / "ddtree_engine"

FIND_SGLANG = "import importlib.metadata as m; d = m.distribution('sglang'); print(d.version, d._path)"


def _sglang_dist_info() -> Path | None:
    for python in (sys.executable, os.environ.get("DDTREE_SGLANG_PYTHON")):
        if not python:
            continue
        out = subprocess.run([python, "-c", FIND_SGLANG], capture_output=True, text=True, check=False)
        if out.returncode == 0:
            version, path = out.stdout.split(maxsplit=1)
            assert version == "0.5.23", f"this check is written against sglang 0.5.23, found {version}"
            return Path(path.strip())
    return None


SGLANG_DIST_INFO = _sglang_dist_info()
pytestmark = pytest.mark.skipif(
    SGLANG_DIST_INFO is None, reason="sglang is not installed here (nor in $DDTREE_SGLANG_PYTHON's env)"
)


@pytest.fixture(scope="module")
def engine_site(tmp_path_factory) -> Path:
    """The engine wheel installed (without dependencies) into a site directory of its own."""
    site = tmp_path_factory.mktemp("engine-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-compile",
         "--target", str(site), str(ENGINE)],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    return site


def run_check(sites: list[Path], required: list[str]) -> dict | None:
    program = (
        "import json, sys; sys.path[:0] = json.loads(sys.argv[1]); import abi_manifest; "
        "print(json.dumps(abi_manifest.sglang_plugin_check(json.loads(sys.argv[2]))))"
    )
    paths = [str(p) for p in sites] + [str(HOST_SCRIPTS)]
    out = subprocess.run(
        [sys.executable, "-S", "-c", program, json.dumps(paths), json.dumps(required)],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return json.loads(out.stdout)


def sglang_site(tmp_path: Path) -> Path:
    site = tmp_path / "sglang-site"
    site.mkdir()
    shutil.copytree(SGLANG_DIST_INFO, site / SGLANG_DIST_INFO.name)
    return site


def test_passes_with_the_engine_wheel_next_to_sglang(tmp_path, engine_site):
    check = run_check([sglang_site(tmp_path), engine_site], ["ddtree_engine"])
    assert check["status"] == "ok", check
    assert "ddtree = ddtree_engine.sglang_plugin:register" in check["reason"]
    assert "ddtree" in check["entry_points"]


def test_fails_when_sglang_has_no_ddtree_entry_point(tmp_path):
    site = sglang_site(tmp_path)
    check = run_check([site], ["ddtree_engine"])
    assert check["status"] == "fail" and not check["ok"], check
    assert "no DDTree entry point in sglang.srt.plugins" in check["reason"]
    assert "install the ddtree-engine wheel" in check["reason"]
    # An env that does not require the engine only notes it.
    assert run_check([site], [])["status"] == "skip"


def test_absent_without_sglang(engine_site):
    assert run_check([engine_site], ["ddtree_engine"]) is None
