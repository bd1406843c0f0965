"""Shared engine-test fixtures: tiny model pairs and engines over them."""

from __future__ import annotations

from pathlib import Path

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
