"""The control package never imports torch: the control node needs none."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import ddtree_ops


def test_importing_every_control_module_loads_no_torch():
    modules = [m.name for m in pkgutil.walk_packages(ddtree_ops.__path__, "ddtree_ops.")]
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'ddtree_engine'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
    assert len(modules) > 20
