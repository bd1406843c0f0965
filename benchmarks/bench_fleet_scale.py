"""Wall time of provision (idle re-run), deploy, healthcheck and compare over 1, 2 and 8 lab hosts, in one run.

One lab of 8 hosts (`lab up --hosts 8`, reused when it already runs in --lab-dir), provisioned once
(that first provision is timed too, but is not a row). Then, for the first 1, the first 2 and all 8
hosts (`--sizes`), the commands a user runs, each timed as a user sees it (the `ddtree-ops` process,
start to exit):

  provision     the idle re-run: every env is already built (changed=0 expected)
  deploy        a real rollout: `--budget` differs from what runs, so each host's tree service is
                restarted and passes the health gate; hosts one at a time, by design
  healthcheck   every service on the hosts, all hosts at once
  compare       --runs 1 --max-tokens 16 on two prompts; hosts one after another (the default: the
                lab's hosts share this machine's CPU)

healthcheck is run HEALTHCHECK_RUNS times per size and its median kept (one run is ~1 s and noisy).
Each command's busy CPU time on this machine (all cores, from /proc/stat, lab hosts included) is
recorded too: divided by the core count it is the least wall time the command can take here, so a
command whose wall is near that floor is bound by the shared cores, not by waiting on hosts in turn.

Prints a table with the ratio 8/1 per command and writes JSON to benchmarks/results/. Every lab host
is a container on this machine: work that runs on a host (a venv check, the engine's generation on the
CPU) is paid once per host on the same cores, which real hosts do not share; and each host's env
takes ~1.1 GB of this machine's disk (the script refuses to start without DISK_PER_HOST_GB per host
free). Say how loaded the machine was next to the figures (the JSON records the load average before
and after).

    python benchmarks/bench_fleet_scale.py [--lab-dir DIR] [--keep] [--sizes 1 2 8] [--json OUT]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPS = str(Path(sys.executable).with_name("ddtree-ops"))
# Every lab host builds its own engine env (torch included) in its container's layer on this disk.
DISK_PER_HOST_GB = 1.2
PROMPTS = "- name: add\n  prompt: Write a Python function that adds two numbers.\n- What is 2+2?\n"


HEALTHCHECK_RUNS = 5


def busy_cpu_s() -> float:
    """CPU seconds this machine has spent busy (all cores, every process: the lab hosts' too), from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])  # steal: not this machine's work
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def ops_timed(*args: str, config: Path, env: dict[str, str]) -> tuple[float, float]:
    """Run `ddtree-ops -c CONFIG ARGS…`; (wall seconds, busy CPU seconds meanwhile). Exits 1 with its output when it fails."""
    cpu0, started = busy_cpu_s(), time.monotonic()
    proc = subprocess.run([OPS, "-c", str(config), *args], capture_output=True, text=True, env=env)
    wall, cpu = time.monotonic() - started, busy_cpu_s() - cpu0
    if proc.returncode != 0:
        sys.exit(f"`ddtree-ops {' '.join(args)}` exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall, cpu


def ops(*args: str, config: Path, env: dict[str, str]) -> float:
    return ops_timed(*args, config=config, env=env)[0]


def git_revision() -> str:
    proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab-dir", type=Path, default=None, help="lab directory (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="leave the lab up afterwards (default: lab down)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 8], help="fleet sizes to time, smallest first")
    parser.add_argument("--json", type=Path, default=None, help="default: benchmarks/results/fleet_scale_<stamp>.json")
    args = parser.parse_args()
    sizes = sorted(set(args.sizes))
    largest = sizes[-1]
    if len(sizes) < 2 or sizes[0] < 1 or largest > 12:
        parser.error("--sizes: at least two fleet sizes between 1 and 12 (each gets its own budget, 12 down to 1)")

    free_gb = shutil.disk_usage("/var/lib/docker" if Path("/var/lib/docker").exists() else "/").free / 1e9
    if free_gb < DISK_PER_HOST_GB * largest:
        sys.exit(
            f"{largest} lab hosts need about {DISK_PER_HOST_GB * largest:.0f} GB of disk for their envs, "
            f"{free_gb:.1f} GB is free: free some, or pass --sizes with fewer hosts"
        )
    lab_dir = args.lab_dir or Path(tempfile.mkdtemp(prefix="ddtree-scale-")) / "lab"
    work = Path(tempfile.mkdtemp(prefix="ddtree-scale-work-"))
    env = {**os.environ, "DDTREE_STATE_DIR": str(work / "state")}
    prompts = work / "prompts.yaml"
    prompts.write_text(PROMPTS)
    load_before = os.getloadavg()
    figures: dict[str, dict[str, float]] = {}
    cpu: dict[str, dict[str, float]] = {}  # busy CPU seconds of this machine during each command
    setup: dict[str, float] = {}
    try:
        started = time.monotonic()
        subprocess.run([OPS, "lab", "up", "--hosts", str(largest), "--dir", str(lab_dir)], check=True, capture_output=True, env=env)
        setup["lab_up"] = time.monotonic() - started
        config = lab_dir / "ddtree.yaml"
        setup["provision_first"] = ops("provision", config=config, env=env)
        setup["deploy_first"] = ops("deploy", config=config, env=env)
        for i, n in enumerate(sizes):
            budget = str(12 - i)  # not what runs there (the project says 15; each size another), so every tree service restarts
            hosts = ",".join(f"lab-{i}" for i in range(1, n + 1))
            row, cpu_row = figures.setdefault(str(n), {}), cpu.setdefault(str(n), {})
            row["provision"], cpu_row["provision"] = ops_timed("provision", "--hosts", hosts, config=config, env=env)
            row["deploy"], cpu_row["deploy"] = ops_timed("deploy", "--hosts", hosts, "--budget", budget, config=config, env=env)
            runs = sorted(ops_timed("healthcheck", "--hosts", hosts, config=config, env=env) for _ in range(HEALTHCHECK_RUNS))
            row["healthcheck"], cpu_row["healthcheck"] = runs[len(runs) // 2]
            row["compare"], cpu_row["compare"] = ops_timed(
                "compare", "--hosts", hosts, "--runs", "1", "--max-tokens", "16", "--prompts", str(prompts),
                "--out", str(work / f"compare-{n}"), config=config, env=env,
            )  # fmt: skip
            print(f"{n} hosts: " + ", ".join(f"{k} {v:.1f}s" for k, v in row.items()), file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            subprocess.run([OPS, "lab", "down", "--dir", str(lab_dir)], capture_output=True, env=env)
            if args.lab_dir is None:
                shutil.rmtree(lab_dir.parent, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)  # Ansible logs, compare reports: the figures are in the JSON

    first = figures[str(sizes[0])]
    ratios = {str(n): {k: figures[str(n)][k] / first[k] for k in first} for n in sizes[1:]}
    cores = os.cpu_count() or 1
    floor = f"CPU floor at {largest} ({cores} cores)"
    print(f"{'command':<12}" + "".join(f" {n:>3} hosts" for n in sizes) + f"  ratio {largest}/{sizes[0]}  {floor}")
    for k in first:
        walls = "".join(f" {figures[str(n)][k]:>8.1f}s" for n in sizes)
        print(f"{k:<12}{walls}  {ratios[str(largest)][k]:>9.2f}x  {cpu[str(largest)][k] / cores:>{len(floor)}.1f}s")
    print("setup: " + ", ".join(f"{k} {v:.1f}s" for k, v in setup.items()))
    stamp = _dt.datetime.now(_dt.timezone.utc)
    doc = {
        "date": stamp.isoformat(timespec="seconds"),
        "git_revision": git_revision(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_before": load_before, "load_after": os.getloadavg()},
        "hosts": sizes,
        "wall_s": {n: {k: round(v, 2) for k, v in row.items()} for n, row in figures.items()},
        "busy_cpu_s": {n: {k: round(v, 2) for k, v in row.items()} for n, row in cpu.items()},
        "healthcheck_runs": HEALTHCHECK_RUNS,
        f"ratio_over_{sizes[0]}": {n: {k: round(v, 2) for k, v in row.items()} for n, row in ratios.items()},
        "setup_s": {k: round(v, 1) for k, v in setup.items()},
        "notes": "lab hosts are containers sharing this machine's CPU; deploy restarts each host's tree service "
        "(--budget changed); compare measures hosts one after another (--runs 1, --max-tokens 16, 2 prompts); "
        "healthcheck: the median of healthcheck_runs; busy_cpu_s: this machine's busy CPU during the command, lab hosts included",
    }
    out = args.json or ROOT / "benchmarks" / "results" / f"fleet_scale_{stamp:%Y%m%d_%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
