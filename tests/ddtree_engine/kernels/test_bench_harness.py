"""benchmarks/bench_tree_step.py's checks before it times: the result scripts' A/B (`compare_arms`) refuses to time an
arm whose tree, compiled or walked arrays differ from the base arm's and exits 1 naming it, and the main benchmark's
JSON carries what mismatched and the run exits 1 (a timing of a wrong result is not a result). Small shapes, in the
interpreter on the CPU (`capture=False`: nothing is timed here, the checks are what is tested)."""

from __future__ import annotations

import json

import pytest
from repo_scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_tree_step.py", "bench_tree_step")


def _off_by_one_walk(original):
    """TreeStep.walk, then the accepted path's first entry one more: a wrong walk whose tree is right."""

    def walk(self, choices):
        original(self, choices)
        self.walked[0][0] += 1

    return walk


def test_equal_arms_pass_and_a_wrong_arm_stops_the_script_by_name(bench, capsys):
    step_cls = bench.TreeStep
    arms = {"as is": {}, "also as is": {(step_cls, "build"): step_cls.build}}
    bench.compare_arms(arms, (5,), "as is", 3, 3000, "cpu", 1, capture=False, name_width=12)
    out = capsys.readouterr().out
    assert out.count("arrays same") == 2 and "MISMATCH" not in out

    arms["wrong walk"] = {(step_cls, "walk"): _off_by_one_walk(step_cls.walk)}
    with pytest.raises(SystemExit, match=r"MISMATCH, not timed: b5 wrong walk \(arrays differ from the 'as is' arm's\)"):
        bench.compare_arms(arms, (5,), "as is", 3, 3000, "cpu", 1, capture=False, name_width=12)
    out = capsys.readouterr().out
    assert "b5 wrong walk: arrays MISMATCH" in out and out.count("arrays same") == 2
    assert step_cls.walk is not arms["wrong walk"][(step_cls, "walk")]  # the flag was put back


def test_report_arms_names_exactly_the_arms_that_differ(bench):
    ((_, logits), _), root, prefix = bench.draws(3, 3000, "cpu")
    steps, graphs = bench.arm_steps(logits, root, prefix, 5, {"a": {}, "b": {}}, [], capture=False)
    assert graphs == {} and bench.report_arms("b5", steps, "a") == []
    steps["b"].compiled[2][0] += 1  # a wrong position in the compiled arrays
    assert bench.report_arms("b5", steps, "a") == ["b"]


def test_the_benchmark_writes_its_json_then_exits_1_on_a_mismatch(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "MISMATCHES", [])
    bench._write(str(tmp_path / "ok"), {"rows": [1]})
    (path,) = (tmp_path / "ok").glob("bench_tree_step_*.json")
    assert json.loads(path.read_text()) == {"rows": [1], "mismatches": []}

    bench.MISMATCHES.append("b15 PDL build vs the serial step")
    with pytest.raises(SystemExit, match=r"MISMATCH in 1 row\(s\): b15 PDL build vs the serial step"):
        bench._write(str(tmp_path / "bad"), {"rows": [1]})
    (path,) = (tmp_path / "bad").glob("bench_tree_step_*.json")
    assert json.loads(path.read_text())["mismatches"] == ["b15 PDL build vs the serial step"]
