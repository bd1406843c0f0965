"""build_threshold_cut_20261204.py run again on the faster threshold build (the same day, ~21:05 UTC: selects that
skip the bits their keys share, the tie order's rows loaded in both layouts, the pool kept in layout order, narrow
levels in a small tile); its JSON renamed build_threshold_cut2_20261204.json. What ran on the H200 was that script
under this name, with only the JSON's name changed.

    python benchmarks/results/build_threshold_cut2_20261204.py [OUT_DIR]
"""

import runpy
import sys
from pathlib import Path

runpy.run_path(str(Path(__file__).with_name("build_threshold_cut_20261204.py")), run_name="__main__")
if len(sys.argv) > 1:
    Path(sys.argv[1], "build_threshold_cut_20261204.json").rename(Path(sys.argv[1], "build_threshold_cut2_20261204.json"))
