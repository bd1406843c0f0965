"""The sweep folder's state: it survives a round trip, only measured cells count as finished, and
`--resume` refuses what it cannot continue."""

from __future__ import annotations

import json

import pytest

from ddtree_ops.exceptions import ConfigError
from ddtree_ops.sweep.state import STATE_FILE, load_state, new_state


def test_state_round_trips_and_only_measured_cells_are_finished(tmp_path):
    state = new_state(tmp_path / "out", {"budgets": [8], "topks": [4]})
    assert not (tmp_path / "out").exists()  # nothing written before the sweep starts
    state.original["gpu-1"] = {"budget": 15, "topk": 8, "release_id": "r1"}
    state.record({"config": "b8-k4", "host": "gpu-1", "status": "ok"})
    state.record({"config": "b8-k4", "host": "gpu-2", "status": "failed"})
    again = load_state(tmp_path / "out")
    assert again.to_dict() == state.to_dict()
    assert again.finished("b8-k4", "gpu-1") and not again.finished("b8-k4", "gpu-2") and not again.finished("b15-k4", "gpu-1")
    assert not list((tmp_path / "out").glob("*.tmp"))  # written whole, then renamed


def test_a_new_sweep_refuses_a_folder_with_a_sweep_and_resume_refuses_garbage(tmp_path):
    (tmp_path / STATE_FILE).write_text(json.dumps({"version": 1, "settings": {}}))
    with pytest.raises(ConfigError, match="--resume"):
        new_state(tmp_path, {})
    (tmp_path / STATE_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="cannot be read"):
        load_state(tmp_path)
    (tmp_path / STATE_FILE).write_text(json.dumps({"version": 99, "settings": {}}))
    with pytest.raises(ConfigError, match="not a sweep state of version 1"):
        load_state(tmp_path)
