"""Fixtures every lab module shares."""

from __future__ import annotations

import shutil

import pytest

from ddtree_ops.provision.engine_source import ENGINE_SRC_ENV, engine_source_dir


@pytest.fixture(scope="module", autouse=True)
def _engine_sources_frozen(tmp_path_factory):
    # The lock hashes the engine's sources: a snapshot keeps a module's provisions on one env even
    # while someone edits the engine; its content (so its hash) is the checkout's.
    snapshot = tmp_path_factory.mktemp("engine") / "ddtree_engine"
    shutil.copytree(engine_source_dir(), snapshot, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENGINE_SRC_ENV, str(snapshot))
        yield
