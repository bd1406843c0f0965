"""Kernel or reference: the one switch the DDTree-step kernels share.

Rule: the Triton kernel serves calls on CUDA tensors when triton imports; the PyTorch
reference serves everything else, so CPU behaviour is the reference's. `DDTREE_KERNELS`
forces a side: `reference`, or `triton` (on CPU tensors this needs `TRITON_INTERPRET=1`, which
is how the kernel tests run in CI); `auto` or unset is the rule above. triton itself is only
imported by the kernel modules, which callers import lazily (`kernel_module`), so a host
without triton keeps working with the references. (gdn_tree/__init__.py applies the same rule.)
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from functools import lru_cache
from types import ModuleType

import torch

ENV = "DDTREE_KERNELS"


@lru_cache(maxsize=1)
def triton_importable() -> bool:
    """Whether `import triton` can succeed on this host."""
    return importlib.util.find_spec("triton") is not None


def use_kernel(tensor: torch.Tensor) -> bool:
    """Whether the Triton kernel serves a call on `tensor` (the rule in the module docstring).

    Args:
        tensor: an input of the call; its device decides when nothing is forced.

    Returns:
        True for the kernel, False for the reference.
    """
    choice = os.environ.get(ENV, "").strip().lower()
    if choice == "reference":
        return False
    if choice == "triton":
        if not tensor.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(f"{ENV}=triton on {tensor.device} tensors needs TRITON_INTERPRET=1")
        return True
    if choice not in ("", "auto"):
        raise ValueError(f"expected {ENV} to be reference, triton or auto, got {choice!r}")
    return tensor.is_cuda and triton_importable()


def kernel_module(package: str) -> ModuleType:
    """Import `<package>.kernel` (the @triton.jit code) on first use.

    Args:
        package: the kernel folder's package name (`__name__` of its __init__).

    Returns:
        The imported module.
    """
    return importlib.import_module(f"{package}.kernel")
