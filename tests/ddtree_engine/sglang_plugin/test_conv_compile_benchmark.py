"""benchmarks/sglang_conv_compile.py against the pinned sglang wheel, on the CPU.

The script compiles SGLang's tree causal-conv1d update for sm_90 with the constants its launcher passes, to
show what a DDTREE start at a wide budget spends compiling (README, deploy's first-start warning). It means
something only while it compiles the kernel SGLang runs: the kernel's parameters are the ones it knows, the
tree path is in the code it compiles, and that code grows with the rows, the loop being unrolled over them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks/sglang_conv_compile.py"


def run(*rows: str) -> subprocess.CompletedProcess:
    # Its own process: tests/ddtree_engine/conftest.py imported Triton here with TRITON_INTERPRET=1.
    env = dict(os.environ, TRITON_DEFAULT_FP_FUSION="1")
    return subprocess.run([sys.executable, str(SCRIPT), *rows], capture_output=True, text=True, env=env, timeout=600)


def test_the_tree_conv_update_compiles_for_sm90_and_grows_with_the_rows():
    proc = run("--chain", "4", "16")
    assert proc.returncode == 0, proc.stderr
    assert "sglang 0.5.23" in proc.stdout
    lines = {(int(r), path): int(n) for r, path, n in re.findall(r"rows +(\d+) \(budget +\d+\) (tree|chain).* (\d+) PTX lines", proc.stdout)}
    assert set(lines) == {(4, "tree"), (4, "chain"), (16, "tree"), (16, "chain")}, proc.stdout
    # Unrolled: four times the rows is about four times the code (6,435 PTX lines at 16 with Triton 3.9) ...
    assert lines[16, "tree"] > 2.5 * lines[4, "tree"]
    # ... and the tree path (parent links, one reduction over all rows per row) is what makes it large.
    assert lines[16, "tree"] > 2 * lines[16, "chain"]


def test_the_engine_kernel_compiles_the_same_code_at_every_width():
    """kernels/tree_conv_update, which the plugin routes DDTREE's tree conv to (DDTREE_SGLANG_TREE_CONV, on by default)."""
    proc = run("--ddtree", "4", "33")
    assert proc.returncode == 0, proc.stderr
    lines = {(int(r), path): int(n) for r, path, n in
             re.findall(r"rows +(\d+) \(budget +\d+\) (tree|ddtree|ddtree-given) ?:.* (\d+) PTX lines", proc.stdout)}
    assert set(lines) == {(r, p) for r in (4, 33) for p in ("tree", "ddtree", "ddtree-given")}, proc.stdout
    # The launcher passes no constant that depends on the rows (tests/ddtree_engine/kernels/test_tree_conv_update.py
    # checks it), so the script compiles the same code at both.
    assert lines[4, "ddtree"] == lines[33, "ddtree"] and lines[4, "ddtree-given"] == lines[33, "ddtree-given"]
    counts = {path: (int(b), int(s), int(m)) for path, b, s, m in
              re.findall(r"rows +4 \(budget +\d+\) (ddtree|ddtree-given):.* (\d+) barriers, (\d+) shuffles, (\d+) shared",
                         proc.stdout)}
    assert set(counts) == {"ddtree", "ddtree-given"}, proc.stdout
    # Taking the parents given, a later layer's launch skips the parent phase and its barrier-separated rounds: one
    # barrier left, before the state update (the finding launch has 4 with the pinned Triton), and it walks a short
    # request's ancestors by warp shuffles, with no shared memory and no barrier for them; the finding launch has none.
    assert counts["ddtree-given"][0] == 1 < counts["ddtree"][0]
    assert counts["ddtree-given"][1] > 0 == counts["ddtree"][1]
    assert counts["ddtree-given"][2] == 0
    # SGLang's at 33 rows is already larger (Triton 3.9: ~10,000 PTX lines against 3,597; 52,426 at 129 rows).
    assert lines[33, "tree"] > 2 * lines[33, "ddtree"]


def test_the_script_refuses_rows_below_one():
    proc = run("0")
    assert proc.returncode == 2 and "rows must be >= 1" in proc.stderr
