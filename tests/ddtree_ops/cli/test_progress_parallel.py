"""Slow steps are not silent, and probes run in parallel (issue 16, point 6).

The hosts are listening sockets on 127.0.0.1 that never answer: the real `ssh` client connects,
waits for the server's banner and gives up after its ConnectTimeout. So one probe costs about one
connect timeout, and N probes in parallel cost about the same; one after another they would cost N.
"""

from __future__ import annotations

import json
import time

from ddtree_ops.config import Host, load_project
from ddtree_ops.exceptions import HostError
from ddtree_ops.health import doctor as doctoring
from ddtree_ops.hosts.probe import probe_in_parallel

CONNECT_TIMEOUT_S = 1


def _timed(invoke, *args):
    started = time.monotonic()
    result = invoke(*args)
    return result, time.monotonic() - started


def test_plan_probes_two_silent_hosts_in_parallel(places, invoke, write_project, project_doc, silent_ports):
    config = str(write_project(project_doc({"a": silent_ports(), "b": silent_ports()})))
    base = ("-c", config, "provision", "--plan", "--json", "--connect-timeout", str(CONNECT_TIMEOUT_S))
    one, one_s = _timed(invoke, *base, "--hosts", "a")
    two, two_s = _timed(invoke, *base, "--hosts", "a,b")
    assert one.exit_code == 1 and two.exit_code == 1, two.output
    # The probe really waited for its connect timeout (else the comparison below proves nothing), and
    # no longer than that timeout (the --connect-timeout given, not a fixed 10 s) …
    assert CONNECT_TIMEOUT_S * 0.9 <= one_s < CONNECT_TIMEOUT_S + 3, one_s
    errors = [h["error"] for h in json.loads(two.stdout)["hosts"]]
    assert len(errors) == 2 and all("timed out" in e for e in errors), errors
    # … and two cost about what one costs.
    assert two_s < 1.5 * one_s, f"two probes took {two_s:.2f}s, one took {one_s:.2f}s: not in parallel"
    # Progress: the start (with the timeout used) and each host's end, on stderr, not in the JSON.
    assert f"plan: probing 2 host(s) in parallel (SSH connect timeout {CONNECT_TIMEOUT_S}s)" in two.stderr
    assert "probe: a: failed after" in two.stderr and "probe: b: failed after" in two.stderr


def _host_phase_s(project, hosts) -> tuple[float, list[str]]:
    # Seconds from "checking N host(s)" to the last host's "done": the control checks before it
    # (ansible-playbook --version takes a second or two) are not part of what is compared.
    stamped: list[tuple[float, str]] = []
    doctoring.run_doctor(project, hosts, connect_timeout_s=CONNECT_TIMEOUT_S, run_manifest=False,
                         progress=lambda line: stamped.append((time.monotonic(), line)))  # fmt: skip
    start = next(t for t, line in stamped if line.startswith("doctor: checking"))
    end = max(t for t, line in stamped if ": done in " in line)
    return end - start, [line for _, line in stamped]


def test_doctor_checks_two_silent_hosts_in_parallel_and_says_so(places, invoke, write_project, project_doc, silent_ports):
    config = write_project(project_doc({"a": silent_ports(), "b": silent_ports()}))
    project = load_project(config)
    one_s, _ = _host_phase_s(project, project.hosts[:1])
    two_s, lines = _host_phase_s(project, project.hosts)
    assert CONNECT_TIMEOUT_S * 0.9 <= one_s < CONNECT_TIMEOUT_S + 3, one_s
    assert two_s < 1.5 * one_s, f"two hosts took {two_s:.2f}s, one took {one_s:.2f}s: not in parallel"
    assert [line.split(" in ")[0] for line in lines if ": done in " in line] in (
        ["doctor: a: done", "doctor: b: done"], ["doctor: b: done", "doctor: a: done"]
    )
    # The CLI shows the same lines on stderr, the checks on stdout.
    result = invoke("-c", str(config), "doctor", "--no-manifest", "--connect-timeout", str(CONNECT_TIMEOUT_S))
    assert result.exit_code == 1
    assert f"doctor: checking 2 host(s) in parallel (SSH connect timeout {CONNECT_TIMEOUT_S}s)" in result.stderr
    assert "doctor: a: done in" in result.stderr and "doctor: b: done in" in result.stderr and "(1 fail" in result.stderr
    assert "doctor:" not in result.stdout


def test_probe_in_parallel_keeps_the_hosts_order_and_each_ones_error():
    hosts = [Host(name=n, address="127.0.0.1") for n in ("slow", "fast", "bad")]
    lines: list[str] = []

    def probe(host: Host):
        if host.name == "bad":
            raise HostError("no answer")
        time.sleep(0.3 if host.name == "slow" else 0.0)
        return host.name  # stands in for HostFacts: only the order and the errors matter here

    results = probe_in_parallel(hosts, probe, lines.append)
    assert results[:2] == ["slow", "fast"] and isinstance(results[2], HostError) and str(results[2]) == "no answer"
    # Progress arrives as hosts finish: the fast one before the slow one.
    finished = [line.split(":")[1].strip() for line in lines]
    assert finished.index("fast") < finished.index("slow") and "probe: bad: failed after" in " ".join(lines)

