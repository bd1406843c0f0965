"""Write a copy of the engine's kernels/gdc.py whose `gdc_enter` launches the next kernel without waiting for the
one before (`griddepcontrol.wait` dropped): the break-check of the PDL replay test
(tests/ddtree_engine/kernels/test_gdc.py::test_a_dependent_launch_step_replays_as_the_plain_one), which must then
fail on the H200. h200_pdl_check.sh runs it on a copy of the engine's source.

    python benchmarks/break_gdc_wait.py SRC_COPY     (SRC_COPY: a copy of engine_patches/ddtree_engine/src)
"""

from __future__ import annotations

import sys
from pathlib import Path

WAIT = "        tl.extra.cuda.gdc_wait()\n"


def drop_wait(src: Path) -> Path:
    """Remove gdc_enter's wait from `src`/ddtree_engine/kernels/gdc.py in place; return that file.

    Raises:
        SystemExit: the wait line is not there once (gdc.py changed: update this script with it).
    """
    path = Path(src) / "ddtree_engine" / "kernels" / "gdc.py"
    text = path.read_text()
    if text.count(WAIT) != 1:
        raise SystemExit(f"break_gdc_wait: expected one line {WAIT.strip()!r} in {path}, found {text.count(WAIT)}; "
                         "update benchmarks/break_gdc_wait.py with gdc.py")
    path.write_text(text.replace(WAIT, "        pass  # break-check: no wait\n"))
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(f"dropped the wait in {drop_wait(Path(sys.argv[1]))}")
