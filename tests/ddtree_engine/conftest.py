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
import torch
from ddtree_engine.reference.engine import ReferenceEngine, load_engine
from engine_oracle import ARCHES
from ddtree_engine.reference.tiny import SLOW_GDN_DECAY, make_tiny_pair
from ddtree_engine.types import SpeculativeConfig


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """Run the engine tests' models on one intra-op thread. Their matrices are tiny, so a
    second thread only adds synchronisation, and on a busy 2-core runner the waiting threads
    spin: measured here, one tree-verify generation took 0.1 s of CPU on one thread and 2-5 s
    on two. Server tests start their own processes and are not affected."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="session")
def tiny_pairs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """One pair per architecture; the hybrid target's Gated-DeltaNet layers decay slowly, so
    their recurrent state shapes the output and a wrongly committed state changes the tokens
    (with Hugging Face's default decay a layer keeps ~1e-4 of it per token and hides such bugs)."""
    root = tmp_path_factory.mktemp("tiny")
    return {arch: make_tiny_pair(root / arch, arch, seed=0, gdn_decay=SLOW_GDN_DECAY) for arch in ARCHES}


@pytest.fixture(scope="session")
def engines(tiny_pairs) -> dict[str, ReferenceEngine]:
    """One engine per architecture; tests swap `engine.spec` / `engine.drafter` as needed."""
    out = {}
    for arch, (target, draft) in tiny_pairs.items():
        out[arch] = load_engine(str(target), str(draft), SpeculativeConfig("ddtree"), device="cpu", dtype="float64")
    return out
