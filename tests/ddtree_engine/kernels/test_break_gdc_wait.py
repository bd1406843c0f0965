"""benchmarks/break_gdc_wait.py, the H200 break-check's patch (h200_pdl_check.sh): on a copy of the engine's source it
removes exactly gdc_enter's wait, and refuses loudly once gdc.py no longer has that line (else the break-check
would run the replay test on an unbroken copy and report it caught nothing)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from repo_scripts import load_script

REPO = Path(__file__).resolve().parents[3]
SRC = REPO / "engine_patches/ddtree_engine/src"


def _script():
    return load_script("benchmarks/break_gdc_wait.py", "break_gdc_wait")


def test_the_copy_loses_the_wait_and_keeps_the_rest(tmp_path):
    copy = tmp_path / "src" / "ddtree_engine" / "kernels"
    copy.mkdir(parents=True)
    shutil.copy(SRC / "ddtree_engine/kernels/gdc.py", copy / "gdc.py")
    original = (SRC / "ddtree_engine/kernels/gdc.py").read_text()
    patched = _script().drop_wait(tmp_path / "src").read_text()
    assert "gdc_wait()" in original and "gdc_wait()" not in patched
    assert "gdc_launch_dependents()" in patched
    assert [line for line in original.splitlines() if "gdc_wait()" not in line] == \
           [line for line in patched.splitlines() if line != "        pass  # break-check: no wait"]
    with pytest.raises(SystemExit, match="expected one line"):
        _script().drop_wait(tmp_path / "src")  # already patched: nothing to drop
