"""healthcheck at fleet scale: N lab hosts are checked at once, not one after another (issue 14, item 6).

At 2 hosts the session's lab (`lab_fleet`) is used, provisioned and deployed again (idempotent, as the
other lab modules do). At 4 and 8 the module-scoped lab is its own (`lab up --hosts N` in a temporary
directory, `lab down` at the end, also when a test fails), provisioned and deployed like any fleet.
healthcheck is then timed three times over one host (`--hosts lab-1`) and three times over all N,
alternating, in the same lab.

What is asserted: every host's checks (its SSH check and each service's HTTP check) are in flight at
once: each started before the first one ended (healthcheck's own `timings_s`). Forcing one worker
(`max_workers=1`), or fewer workers than checks, makes it fail.

What is printed, not asserted: the wall ratio N/1 (median of 3 each; issue 14's target is <= 1.5 at 8).
Every lab host is a container on this one machine (2 cores in CI), so what runs on a host — the
engine's greedy generation on the CPU, sshd's side of each login — is paid N times on the same cores
however the checks are scheduled; on a real fleet each host does it on its own. Measured on the 2-core
machine, shared: see the README's scale table.

CI runs the 2-host case: 6 checks, each started before the first ended (one worker, or fewer than 6,
fails it), at the cost of an idempotent provision and deploy of a lab that is already up. The 4-host
lab ran in CI until 2026-12-07 and took 4.5 min there (272 s of it bringing the lab up, provisioning
four venvs and deploying); it and the 8-host one run with DDTREE_SCALE=1 (the 8-host's first
provision alone took 9 min 18 s here, and its envs ~9 GB of disk).
"""

from __future__ import annotations

import json
import os
import statistics
import time

import pytest
from click.testing import CliRunner

from ddtree_ops.cli import cli

pytestmark = pytest.mark.lab

RUNS = 3
TARGET_RATIO = 1.5  # issue 14's target for 8 hosts vs 1, on hosts that are machines of their own
SCALE_ENV = "DDTREE_SCALE"


def _run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def scale_lab(request, tmp_path_factory):
    """N lab hosts (the test's parameter), provisioned and deployed: the session's 2, or `lab up --hosts N` of its own."""
    from ddtree_ops import lab

    n_hosts = request.param
    if n_hosts == 2:
        report = request.getfixturevalue("lab_fleet")
        yield _provisioned_and_deployed(str(report.config_path)), [h.name for h in report.hosts]
        return
    if os.environ.get(SCALE_ENV) != "1":
        pytest.skip(f"{n_hosts} lab hosts of their own take 4.5-15 min and 4-9 GB of disk on a 2-core machine: set {SCALE_ENV}=1")
    request.getfixturevalue("docker_available")
    lab_dir = tmp_path_factory.mktemp(f"scale{n_hosts}") / "lab"
    try:
        report = lab.up(n_hosts, lab_dir)
        yield _provisioned_and_deployed(str(report.config_path)), [h.name for h in report.hosts]
    finally:
        lab.down(lab_dir)


def _provisioned_and_deployed(config: str) -> str:
    provision = _run("-c", config, "provision")
    assert provision.exit_code == 0, provision.output
    deploy = _run("-c", config, "deploy")
    assert deploy.exit_code == 0, deploy.output
    return config


def _healthcheck(config: str, hosts: list[str]) -> tuple[float, dict]:
    """One `healthcheck --json` over `hosts`: (wall seconds, the document)."""
    started = time.monotonic()
    result = _run("-c", config, "healthcheck", "--hosts", ",".join(hosts), "--json")
    wall = time.monotonic() - started
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert sorted(h["host"] for h in doc["hosts"]) == sorted(hosts)
    return wall, doc


def assert_hosts_checked_at_once(config: str, hosts: list[str]) -> dict:
    """Time healthcheck over hosts[:1] and over all `hosts` (RUNS each, alternating); assert the checks overlap.

    Returns:
        the median walls and their ratio (also printed).
    """
    walls: dict[str, list[float]] = {"one": [], "all": []}
    for _ in range(RUNS):
        for key, selected in (("one", hosts[:1]), ("all", hosts)):
            wall, doc = _healthcheck(config, selected)
            walls[key].append(round(wall, 2))
            if key == "one":
                continue
            checks = doc["timings_s"]["checks"]
            assert {c["host"] for c in checks} == set(hosts) and len(checks) == len(hosts) * 3, checks
            first_end = min(c["end"] for c in checks)
            late = [f"{c['host']}/{c['check']} at {c['start']:.2f}s" for c in checks if c["start"] > first_end]
            assert not late, (
                f"healthcheck over {len(hosts)} hosts (workers {doc['timings_s']['workers']}) did not run its checks "
                f"at once: the first ended at {first_end:.2f}s, and these only started after it: {late}"
            )
    one, all_ = statistics.median(walls["one"]), statistics.median(walls["all"])
    figures = {"hosts": len(hosts), "wall_one": one, "wall_all": all_, "ratio": round(all_ / one, 2), "runs": walls}
    print(f"healthcheck over {len(hosts)} hosts vs 1 (median of {RUNS}; target <= {TARGET_RATIO}x on real hosts): {json.dumps(figures)}")
    return figures


@pytest.mark.parametrize("scale_lab", [2, 4, 8], indirect=True, ids=["2-hosts", "4-hosts", "8-hosts"])
def test_healthcheck_checks_every_host_at_once(scale_lab):
    config, hosts = scale_lab
    assert_hosts_checked_at_once(config, hosts)
