"""Shared engine-test fixtures: tiny model pairs and engines over them."""

from __future__ import annotations

import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    # Kernel tests: without a GPU, Triton runs only in its interpreter, and TRITON_INTERPRET is
    # read when @triton.jit decorates (triton's own library too), and transformers' import of
    # torch._dynamo imports triton: so it is set here, before anything below imports it.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from ddtree_engine.reference.engine import ReferenceEngine, load_engine
from engine_oracle import ARCHES
from ddtree_engine.reference.tiny import make_tiny_pair
from ddtree_engine.types import SpeculativeConfig


@pytest.fixture(scope="session")
def tiny_pairs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("tiny")
    return {arch: make_tiny_pair(root / arch, arch, seed=0) for arch in ARCHES}


@pytest.fixture(scope="session")
def engines(tiny_pairs) -> dict[str, ReferenceEngine]:
    """One engine per architecture; tests swap `engine.spec` / `engine.drafter` as needed."""
    out = {}
    for arch, (target, draft) in tiny_pairs.items():
        out[arch] = load_engine(str(target), str(draft), SpeculativeConfig("ddtree"), device="cpu", dtype="float64")
    return out
