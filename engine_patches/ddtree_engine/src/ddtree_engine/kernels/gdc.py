"""Programmatic dependent launch (PDL) for the DDTree-step kernels, on Hopper and later.

In a CUDA graph each kernel of the step starts only after the one before it has drained, a gap of
a few microseconds per launch that a step of five small kernels pays five times. With PDL
(`launch_pdl=True`, compute capability 9.0 and later) the next kernel is launched while this one
runs: its programs start, then wait in `griddepcontrol.wait` until the kernel before has finished
and its writes are visible. So every kernel that takes `GDC` calls `gdc_enter` before it touches
global memory: the wait first (nothing is read or written before the kernel before is done,
whichever kernel that is), then `griddepcontrol.launch_dependents`, which lets the next kernel be
launched early. The result is the same arrays; only the launch gaps change.

`launch_options` decides per call: where the device can (CUDA tensors on compute capability 9.0 or
later), `DDTREE_PDL=1` (true, yes, on) turns it on and `DDTREE_PDL=0` (false, no, off) off; unset,
`DEFAULT` (on). Never on the CPU
(TRITON_INTERPRET=1 has no griddepcontrol) or older GPUs, where the kernels compile without the two
instructions.
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch
import triton
import triton.language as tl

ENV = "DDTREE_PDL"
# On by default (Hopper and later) since 2026-12-06. Measured on the H200 on 2026-12-05
# (benchmarks/results/bench_tree_step_20261205_030749.*): the graphed step 2.1-2.9 us faster at every budget
# (budget 15 25.7 against 27.8 us, 256 48.9 against 51.8); on an H100 on 2026-12-06 24.4 against 26.6 at budget 15
# (bench_tree_step_20261206_035638_h100.*). Checked with it: the same arrays as plain launches on 4 shapes x 24 graph
# replays (test_gdc.py), and the break-check (that test fails on an engine whose kernels do not wait,
# benchmarks/h200_pdl_check.sh); the kernel and SGLang-worker suites with DDTREE_PDL=1 on H100s on 2026-12-05/06,
# test_tree_build.py whole but for 3 cases that no 420 s call finishes, with PDL or without (the threshold build at
# 2/4/8 warps: a compile per budget), all passed (pdl_check_2026120[56]_h100_*.txt); in SGLang the lab pair's
# DDTREE 15/8 and 128/8 with CUDA graphs token-identical to AR on 8 of 8 prompts (sglang_h*_wide*_2026-12-05.json).
# DDTREE_PDL=0 launches them plainly.
DEFAULT = True
# The words of the engine's on/off switches (sglang_plugin/prep.env_switch; ddtree_ops/knowledge/engine_env.yaml).
_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@triton.jit
def gdc_enter(GDC: tl.constexpr):
    """Wait for the kernel before (all its writes visible), then let the next kernel launch. No-op unless GDC."""
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@lru_cache(maxsize=None)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def enabled(tensor: torch.Tensor, pdl: bool | None = None) -> bool:
    """Whether kernels on `tensor`'s device launch with PDL.

    Args:
        tensor: an input of the launch; its device decides.
        pdl: True or False to force (True on a device that cannot is an error), None for the rule
            in the module docstring (DDTREE_PDL, else DEFAULT).

    Returns:
        True where the launch takes `launch_pdl=True` and the kernel its GDC instructions.

    Raises:
        ValueError: `DDTREE_PDL` not one of the switch words, or pdl=True where PDL cannot run.
    """
    choice = os.environ.get(ENV, "").strip().lower()
    if choice and choice not in _ON + _OFF:
        raise ValueError(f"expected {ENV} to be one of {', '.join(_ON + _OFF)} (or unset), got {choice!r}")
    able = tensor.is_cuda and os.environ.get("TRITON_INTERPRET") != "1" and _capable(tensor.device.index or 0)
    if pdl is None:
        return able and (choice in _ON if choice else DEFAULT)
    if pdl and not able:
        raise ValueError(f"programmatic dependent launch needs a CUDA device of compute capability 9.0 or later, "
                         f"got {tensor.device}")
    return bool(pdl)


def launch_options(tensor: torch.Tensor, pdl: bool | None = None) -> dict:
    """Keyword arguments of a launch: the kernel's GDC constexpr and, where on, Triton's `launch_pdl`.

    Args:
        tensor, pdl: as `enabled`.

    Returns:
        {"GDC": False} or {"GDC": True, "launch_pdl": True}.
    """
    on = enabled(tensor, pdl)
    return {"GDC": True, "launch_pdl": True} if on else {"GDC": False}
