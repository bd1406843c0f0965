"""benchmarks/sglang_h200/step_cost.py's orchestration, on the CPU against a stand-in `sglang.Engine`.

The H200 runs are few and short, so the harness's own logic is checked here: every arm measured
ROUNDS times, one at a time, arm after arm (odd rounds in reverse), the median round kept, each
round's figure printed, profiles only after all rounds, and the outputs compared with the group's
first arm. The stand-in engine records which arm generated when; it is not SGLang (that runs on
the H200 only), so nothing here measures speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
STEP_COST = REPO / "benchmarks/sglang_h200/step_cost.py"

FAKE_SGLANG = r'''
import json, os, subprocess, sys, time

# A stand-in scheduler process, titled as SGLang titles its own (PIN_CPUS finds it by that); it ends with
# the engine's process. Like SGLang's Engine, the stand-in returns once its scheduler says it is ready
# (just after exec, /proc/PID/cmdline can still read empty).
# It runs a second thread, as SGLang's scheduler runs many: PIN_MAIN_CPU pins only the main one.
SCHEDULER = (
    "import os, threading, time\np = os.getppid()\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    "print('ready', flush=True)\nwhile os.getppid() == p:\n    time.sleep(0.2)"
)


def _arm(kw):
    algo = kw.get("speculative_algorithm")
    return "dflash" if algo == "DFLASH" else f"ddtree-{kw['speculative_ddtree_budget']}" if algo else "ar"


def _log(**event):
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(json.dumps({**event, "t": time.time()}) + "\n")


class Engine:
    def __init__(self, server_args=None, **kw):
        self.kw = dict(server_args or kw)
        self.arm = _arm(self.kw)
        self.decodes = 0
        self.scheduler = subprocess.Popen([sys.executable, "-c", SCHEDULER, "sglang::scheduler_TP0"], stdout=subprocess.PIPE)
        self.scheduler.stdout.readline()

    def generate(self, input_ids, sampling_params):
        n = sampling_params["max_new_tokens"]
        if n >= 256:
            self.decodes += 1
            if self.arm == os.environ.get("FAKE_DIE_ARM") and self.decodes > int(os.environ["FAKE_DIE_AFTER"]):
                os._exit(3)  # the engine dies mid-round
        _log(arm=self.arm, n=n)
        time.sleep(0.002)
        ids = [(sum(input_ids) + i) % 97 for i in range(min(n, 12))]
        if self.arm == "ddtree-8" and input_ids[0] == 4:
            ids[-1] += 1  # one prompt whose output differs from the first arm's
        return {"output_ids": ids, "meta_info": {"spec_verify_ct": max(1, len(ids) // 3)}}

    def freeze_gc(self):
        _log(arm=self.arm, freeze_gc=True)

    def start_profile(self, output_dir, **kw):
        _log(arm=self.arm, profile=True)

    def shutdown(self):
        _log(arm=self.arm, shutdown=True)
        self.scheduler.kill()
'''


def run_harness(tmp_path, groups, rounds, **env_extra):
    fake = tmp_path / "fake"
    (fake / "sglang/srt").mkdir(parents=True)
    (fake / "sglang/__init__.py").write_text(FAKE_SGLANG)
    (fake / "sglang/srt/__init__.py").write_text("")
    (fake / "sglang/srt/plugins.py").write_text("def load_plugins():\n    pass\n")
    (fake / "sglang/srt/server_args.py").write_text("class ServerArgs(dict):\n    def __init__(self, **kw):\n        dict.__init__(self, **kw)\n")
    models = tmp_path / "models"
    models.mkdir()
    prompts = [{"name": "a", "prompt_ids": [1, 2, 3]}, {"name": "b", "prompt_ids": [4, 5]}]
    (models / "lab_prompts.json").write_text(json.dumps(prompts))
    log = tmp_path / "gen.log"
    env = dict(os.environ, PYTHONPATH=str(fake), ROUNDS=str(rounds), ARM_TIMEOUT_S="60", FAKE_LOG=str(log),
               STEP_COST_TMP=str(tmp_path), **env_extra)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(STEP_COST), str(models), str(out), json.dumps(groups)],
                          capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    return json.loads((out / "sglang_h200_step_cost.json").read_text()), events, proc.stdout


def measured_runs(events, n_tokens):
    """(arm, decodes) for each run of consecutive decodes of n_tokens by one arm, in time order."""
    runs = []
    for e in events:
        if e.get("n") != n_tokens:
            continue
        if runs and runs[-1][0] == e["arm"]:
            runs[-1] = (e["arm"], runs[-1][1] + 1)
        else:
            runs.append((e["arm"], 1))
    return runs


def test_arms_are_measured_one_at_a_time_round_after_round_with_odd_rounds_reversed(tmp_path):
    groups = [{"model": "lab", "prompts": "lab", "repeat": 2, "arms": ["dflash", "ddtree-graph-15-8", "ddtree-graph-8-4"],
               "profile": ["ddtree-graph-15-8"]}]
    results, events, stdout = run_harness(tmp_path, groups, rounds=3)
    # Decodes of 256 tokens: a round is 2 prompts x repeat 2 = 4 per arm, round 0 warms up with 2 more.
    # Rounds 0 and 2 run the arms in order, round 1 in reverse (an arm ending one round starts the next).
    assert measured_runs(events, 256) == [("dflash", 6), ("ddtree-15", 6), ("ddtree-8", 6 + 4), ("ddtree-15", 4),
                                          ("dflash", 4 + 4), ("ddtree-15", 4), ("ddtree-8", 4)]
    # Profiles and shutdowns only after every arm's last round, one arm after another.
    last_measured = max(e["t"] for e in events if e.get("n") == 256)
    profiles = [e for e in events if e.get("profile")]
    assert [e["arm"] for e in profiles] == ["ddtree-15"] and profiles[0]["t"] > last_measured
    ends = [(e["arm"], "profile" if e.get("profile") else "shutdown") for e in events if e.get("profile") or e.get("shutdown")]
    assert ends == [("dflash", "shutdown"), ("ddtree-15", "profile"), ("ddtree-15", "shutdown"), ("ddtree-8", "shutdown")]
    assert min(e["t"] for e in events if e.get("shutdown")) > last_measured
    by_arm = {r["arm"]: r for r in results}
    for r in results:
        assert r["rc"] == 0 and len(r["rounds"]) == 3 and len(r["step_ms_rounds"]) == 3
        assert r["step_ms"] == sorted(r["step_ms_rounds"])[1]  # the median round's figure
        # repeat 2: each prompt twice a round, so twice the tokens of one pass (12 + 12 per pass).
        assert r["tokens"] == 2 * 24 and [p["name"] for p in r["per_prompt"]] == ["a", "b"]
    # The table: every round's ms/step, and the outputs against the first arm's (ddtree-8 differs on b).
    rows = {line.split("|")[1].strip(): line for line in stdout.splitlines() if line.startswith("| ")}
    assert rows["ddtree-graph-15-8"].rstrip().endswith("| 2/2 |")
    assert rows["ddtree-graph-8-4"].rstrip().endswith("| 1/2 |")
    assert " ".join(f"{x:.2f}" for x in by_arm["dflash"]["step_ms_rounds"]) in rows["dflash"]
    # Per round, an arm's tok/s over DFLASH's of the same round; the median of the three, and the range.
    each = sorted(a["tok_per_s"] / b["tok_per_s"] for a, b in zip(by_arm["ddtree-graph-15-8"]["rounds"], by_arm["dflash"]["rounds"]))
    assert f"| {each[1]:.3f} ({each[0]:.2f}-{each[2]:.2f}) |" in rows["ddtree-graph-15-8"]
    assert "| 1.000 (1.00-1.00) |" in rows["dflash"]
    # The same pairing of ms/step; real prompts have no quickest-decode figure ("-").
    each = sorted(a["step_ms"] / b["step_ms"] for a, b in zip(by_arm["ddtree-graph-15-8"]["rounds"], by_arm["dflash"]["rounds"]))
    assert f"| {each[1]:.3f} ({each[0]:.2f}-{each[2]:.2f}) | - |" in rows["ddtree-graph-15-8"]


def test_synthetic_groups_measure_every_round_and_keep_one_figure_per_arm(tmp_path):
    groups = [{"model": "q35-4b", "dummy": True, "arms": ["dflash", "ddtree-graph-15-8"]}]
    results, events, stdout = run_harness(tmp_path, groups, rounds=2)
    # Two timed 257-token decodes per arm and round; round 1 reversed.
    assert measured_runs(events, 257) == [("dflash", 2), ("ddtree-15", 2 + 2), ("dflash", 2)]
    # "repeat": 3 times 6 a round.
    _, events, _ = run_harness(tmp_path / "repeat", [dict(groups[0], repeat=3)], rounds=1)
    assert measured_runs(events, 257) == [("dflash", 6), ("ddtree-15", 6)]
    for r in results:
        assert len(r["step_ms_rounds"]) == 2 and r["steps"] == 4 and "per_prompt" not in r
        assert r["step_ms"] == min(r["step_ms_rounds"])  # an even count: the lower middle round
        for m in r["rounds"]:  # every decode's time kept; the quickest one's ms/step beside the median's
            assert len(m["t257_each_s"]) == 2 and m["t257_s"] == sum(m["t257_each_s"]) / 2
            assert m["step_ms_best"] == (min(m["t257_each_s"]) - m["prefill_s"]) / m["steps"] * 1e3 < m["step_ms"]
    # The table pairs rounds: ms/step and the quickest decode's, each over DFLASH's of the same round.
    by_arm = {r["arm"]: r for r in results}
    rows = {line.split("|")[1].strip(): line for line in stdout.splitlines() if line.startswith("| ")}
    for key in ("step_ms", "step_ms_best"):
        each = sorted(a[key] / b[key] for a, b in zip(by_arm["ddtree-graph-15-8"]["rounds"], by_arm["dflash"]["rounds"]))
        assert f"| {each[0]:.3f} ({each[0]:.2f}-{each[1]:.2f}) |" in rows["ddtree-graph-15-8"]
    # One arm at a time ends, after both arms' rounds (ROUNDS=1 would otherwise overlap them).
    last_measured = max(e["t"] for e in events if e.get("n") == 257)
    assert min(e["t"] for e in events if e.get("shutdown")) > last_measured


def test_an_arm_that_dies_mid_round_keeps_its_finished_rounds_and_the_others_go_on(tmp_path):
    groups = [{"model": "lab", "prompts": "lab", "arms": ["dflash", "ddtree-graph-8-4", "ddtree-graph-15-8"]}]
    # ddtree-8 dies on its first decode of round 1 (round 0: 2 warm-up + 2 measured decodes).
    results, events, stdout = run_harness(tmp_path, groups, rounds=3, FAKE_DIE_ARM="ddtree-8", FAKE_DIE_AFTER="4")
    by_arm = {r["arm"]: r for r in results}
    dead = by_arm["ddtree-graph-8-4"]
    assert dead["rc"] == 3 and len(dead["step_ms_rounds"]) == 1 and "err" in dead
    for arm in ("dflash", "ddtree-graph-15-8"):
        assert by_arm[arm]["rc"] == 0 and len(by_arm[arm]["step_ms_rounds"]) == 3
    assert measured_runs(events, 256)[-1] == ("ddtree-15", 2)  # round 2 ran without the dead arm
    assert "| ddtree-graph-8-4 |" in stdout


def test_every_round_is_printed_and_kept_in_a_partial_file_as_it_ends(tmp_path):
    """A device call cut short by its time limit leaves no final table: each round's ms/step is printed as
    the round ends and kept in OUT/sglang_h200_step_cost.partial.json, with the groups finished before."""
    groups = [{"model": "q35-4b", "dummy": True, "arms": ["dflash", "ddtree-graph-15-8"]},
              {"model": "lab", "prompts": "lab", "arms": ["dflash", "ddtree-graph-8-4"]}]
    results, _, stdout = run_harness(tmp_path, groups, rounds=2)
    lines = [line for line in stdout.splitlines() if line.startswith("round ")]
    assert [line.split(":")[0] for line in lines] == ["round 0 of q35-4b", "round 1 of q35-4b", "round 0 of lab", "round 1 of lab"]
    by_arm = {(r["model"], r["arm"]): r for r in results}
    first, last = lines[0], lines[-1]
    assert f"dflash {by_arm['q35-4b', 'dflash']['step_ms_rounds'][0]:.2f} ms/step" in first
    assert ("ddtree-graph-8-4 " + " ".join(f"{x:.2f}" for x in by_arm["lab", "ddtree-graph-8-4"]["step_ms_rounds"])) in last
    partial = json.loads((tmp_path / "out/sglang_h200_step_cost.partial.json").read_text())
    # After the last round: the first group's full results, then the second group's rounds so far.
    assert [(p["model"], p["arm"]) for p in partial] == [("q35-4b", "dflash"), ("q35-4b", "ddtree-graph-15-8"),
                                                         ("lab", "dflash"), ("lab", "ddtree-graph-8-4")]
    assert partial[0]["step_ms"] == by_arm["q35-4b", "dflash"]["step_ms"]
    assert partial[3]["step_ms_rounds"] == by_arm["lab", "ddtree-graph-8-4"]["step_ms_rounds"]
    assert len(partial[3]["tok_per_s_rounds"]) == 2


def test_pin_cpus_pins_every_arms_scheduler_to_the_same_cpus(tmp_path):
    cpu = min(os.sched_getaffinity(0))
    groups = [{"model": "lab", "prompts": "lab", "arms": ["dflash", "ddtree-graph-15-8"]}]
    results, _, _ = run_harness(tmp_path, groups, rounds=1, PIN_CPUS=str(cpu))
    for r in results:
        assert r["rc"] == 0 and len(r["pinned"]) == 1, r
        assert r["pinned"][0]["cpus"] == [cpu] and r["pinned"][0]["threads"] == 2 and not r["pinned"][0]["main_only"]
    # PIN_MAIN_CPU: the main thread only.
    results, _, _ = run_harness(tmp_path / "main", groups, rounds=1, PIN_MAIN_CPU=str(cpu))
    for r in results:
        assert r["pinned"][0]["cpus"] == [cpu] and r["pinned"][0]["threads"] == 1 and r["pinned"][0]["main_only"], r
    # Without PIN_CPUS nothing is pinned or recorded.
    results, _, _ = run_harness(tmp_path / "again", groups, rounds=1)
    assert all("pinned" not in r and "pin_error" not in r for r in results)


def test_freeze_gc_freezes_each_arm_once_after_its_warm_up(tmp_path):
    groups = [{"model": "lab", "prompts": "lab", "arms": ["dflash", "ddtree-graph-15-8"]}]
    results, events, _ = run_harness(tmp_path, groups, rounds=2, FREEZE_GC="1")
    for arm in ("dflash", "ddtree-15"):
        mine = [e for e in events if e["arm"] == arm and (e.get("n") == 256 or e.get("freeze_gc"))]
        # Round 0: two warm-up decodes (one per prompt), the freeze, then the measured ones.
        assert [bool(e.get("freeze_gc")) for e in mine[:4]] == [False, False, True, False]
        assert sum(1 for e in mine if e.get("freeze_gc")) == 1
    assert all(r["gc_frozen"] is True for r in results)
    _, plain_events, _ = run_harness(tmp_path / "plain", groups, rounds=1)
    assert not any(e.get("freeze_gc") for e in plain_events)


def test_from_five_rounds_the_paired_median_comes_with_its_bootstrap_interval(tmp_path):
    import re

    groups = [{"model": "q35-4b", "dummy": True, "arms": ["dflash", "ddtree-graph-15-8"]}]
    results, _, stdout = run_harness(tmp_path, groups, rounds=5)
    by_arm = {r["arm"]: r for r in results}
    row = next(line for line in stdout.splitlines() if line.startswith("| ddtree-graph-15-8 "))
    # (The stand-in's figures are no speeds: a ratio may be negative.)
    num = r"(-?\d+\.\d+)"
    cells = re.findall(rf"{num} \({num}-{num}; 95 % {num}-{num}\)", row)
    assert len(cells) == 3, row  # tok/s, ms/step, the quickest decode's ms/step
    for (med, lo_all, hi_all, lo, hi), key in zip(cells, ("tok_per_s", "step_ms", "step_ms_best")):
        each = sorted(a[key] / b[key] for a, b in zip(by_arm["ddtree-graph-15-8"]["rounds"], by_arm["dflash"]["rounds"]))
        assert med == f"{each[2]:.3f}" and float(lo) <= float(med) <= float(hi)
        # A resample's median is one of the rounds' ratios: so is each end of the interval.
        shown = {f"{x:.3f}" for x in each}
        assert lo in shown and hi in shown and lo != f"{each[-1]:.3f}" and hi != f"{each[0]:.3f}"
