"""healthcheck and compare on an `engine.backend: sglang` project, against loopback servers in SGLang's shapes.

No real SGLang runs on this CPU machine: `sglang_shapes.FakeSGLang` (tests/_support) answers with bodies
copied from SGLang 0.5.23's source, each shape citing its file:line. These tests show that the tools read
those shapes end to end: health, server_info (settings, no key leaks), generation, acceptance from SGLang's
counters, the lossless check and the report.
"""

from __future__ import annotations

import json

import pytest
from sglang_shapes import FakeSGLang, Served

from ddtree_ops.compare.prompts import BUILTIN_PROMPTS
from ddtree_ops.compare.run import run_compare, write_compare_files
from ddtree_ops.config import parse_project
from ddtree_ops.health.check import run_healthcheck

KEY = "sk-endpoint-test-key"


def fakes(**tree_kw):
    baseline = FakeSGLang(model_path="/models/q35", algorithm="DFLASH", draft_path="/models/d", accept=2, api_key=KEY)
    tree = FakeSGLang(model_path="/models/q35", algorithm="DDTREE", draft_path="/models/d", budget=15, topk=8,
                      accept=4, api_key=KEY, **tree_kw)  # fmt: skip
    return baseline, tree


def sglang_project(baseline_port: int, tree_port: int, budget: int = 15):
    return parse_project(
        {
            "hosts": [{"name": "local", "address": "127.0.0.1"}],
            "engine": {"backend": "sglang", "target": "/models/q35", "draft": "/models/d"},
            "services": [
                {"name": "baseline", "algorithm": "dflash", "port": baseline_port},
                {"name": "tree", "algorithm": "ddtree", "budget": budget, "topk": 8, "port": tree_port},
            ],
        }
    )


@pytest.fixture
def served(monkeypatch):
    monkeypatch.setenv("DDTREE_API_KEY", KEY)
    baseline, tree = fakes()
    with Served(baseline) as b, Served(tree) as t:
        yield b, t


def test_healthcheck_reads_sglangs_endpoints(served):
    b, t = served
    report = run_healthcheck(sglang_project(b.port, t.port), check_systemd=False)
    assert report.ok, report.failures()
    by_name = {r.service: r for r in report.results}
    assert by_name["tree"].info["speculative_ddtree_budget"] == 15
    # The probe asks 8 tokens: 1 from the prefill, 7 from ceil(7/4) = 2 tree steps or ceil(7/2) = 4 linear ones.
    assert by_name["tree"].accept_length == 3.5 and by_name["baseline"].accept_length == 1.75
    assert by_name["tree"].accept_length_recent == 3.5
    assert by_name["tree"].generation_tokens == 8
    assert KEY not in json.dumps(report.to_dict()), "the --json document must not carry SGLang's api_key"


def test_healthcheck_names_what_sglang_got_wrong(monkeypatch):
    monkeypatch.setenv("DDTREE_API_KEY", KEY)
    baseline, tree = fakes(health_generate_status=503)
    with Served(baseline) as b, Served(tree) as t:
        report = run_healthcheck(sglang_project(b.port, t.port, budget=7), check_systemd=False)
    failures = report.failures()
    assert any("/health_generate answered 503" in f for f in failures), failures
    assert any("speculative_ddtree_budget: server says 15, deployed 7" in f for f in failures), failures
    assert all(f.startswith("local/tree:") for f in failures), "the healthy baseline has no failure"


def test_healthcheck_without_the_key_is_refused_by_sglang(monkeypatch, served):
    monkeypatch.delenv("DDTREE_API_KEY")
    b, t = served
    report = run_healthcheck(sglang_project(b.port, t.port), check_systemd=False)
    assert not report.ok
    assert any("401" in f and "/server_info" in f for f in report.failures()), report.failures()


def test_compare_measures_sglang_services_from_usage_and_counters(served, tmp_path):
    b, t = served
    report = run_compare(sglang_project(b.port, t.port), BUILTIN_PROMPTS[:2], runs=2, max_tokens=9)
    assert report.ok, report.failure_lines()
    measured = [r for r in report.runs if r.error is None]
    assert len(measured) == 2 * 2 * 2
    for run in measured:
        assert run.completion_tokens == 9 and run.generation_tokens_delta == 9
        assert run.accept_length == {"baseline": 2.0, "tree": 4.0}[run.arm]
    assert all(s.lossless.ok for s in report.summaries)
    assert (report.settings.budget, report.settings.topk, report.settings.block_size) == (15, 8, 16)
    files = write_compare_files(report, tmp_path)
    texts = {p.name: p.read_text() for p in files.values() if p.suffix in (".json", ".md")}
    assert "compare.json" in texts and '"launch_command"' in texts["compare.json"], "server_info is kept"
    assert [name for name, text in texts.items() if KEY in text] == [], "no report file carries the API key"


def test_compare_catches_a_tree_that_is_not_lossless(served):
    b, t = served
    original = t.fake.generate

    def diverging(max_tokens: int, prompt_tokens: int) -> list[str]:
        words = original(max_tokens, prompt_tokens)
        return words[:3] + [" other"] + words[4:]

    t.fake.generate = diverging
    report = run_compare(sglang_project(b.port, t.port), BUILTIN_PROMPTS[:1], runs=1, max_tokens=9)
    assert not report.ok
    assert not report.summaries[0].lossless.ok


def test_the_cli_json_documents_validate_and_carry_no_key(served, tmp_path):
    """`healthcheck --json` and `compare --json` through the real CLI, validated against the shipped schemas."""
    import yaml
    from click.testing import CliRunner
    from json_schemas import validate

    from ddtree_ops.cli import cli

    b, t = served
    config = tmp_path / "ddtree.yaml"
    project = sglang_project(b.port, t.port)
    config.write_text(yaml.safe_dump(project.model_dump(mode="json")))
    runner = CliRunner()
    health = runner.invoke(cli, ["-c", str(config), "healthcheck", "--no-systemd", "--json"], catch_exceptions=False)
    assert health.exit_code == 0, health.output
    compare = runner.invoke(
        cli, ["-c", str(config), "compare", "--runs", "1", "--max-tokens", "5", "--out", str(tmp_path / "r"), "--json"],
        catch_exceptions=False,
    )  # fmt: skip
    assert compare.exit_code == 0, compare.output
    for result in (health, compare):
        doc = validate(json.loads(result.stdout))
        assert doc["ok"] is True and KEY not in result.stdout


def test_compare_measures_hosts_at_once_with_parallel_hosts_and_reports_them_in_host_order(monkeypatch):
    """Two hosts (127.0.0.2 and .3, the same ports): --parallel-hosts 2 overlaps them; 1 (the default) does not."""
    import threading
    import time

    monkeypatch.setenv("DDTREE_API_KEY", KEY)
    lock, in_flight, peak = threading.Lock(), [0], [0]

    def counted(fake):
        original = fake.generate

        def generate(max_tokens: int, prompt_tokens: int) -> list[str]:
            with lock:
                in_flight[0] += 1
                peak[0] = max(peak[0], in_flight[0])
            try:
                time.sleep(0.05)  # long enough that two hosts measured at once are seen generating together
                return original(max_tokens, prompt_tokens)
            finally:
                with lock:
                    in_flight[0] -= 1

        fake.generate = generate
        return fake

    b1, t1 = (counted(f) for f in fakes())
    b2, t2 = (counted(f) for f in fakes())
    with Served(b1, "127.0.0.2") as sb1, Served(t1, "127.0.0.2") as st1:
        with Served(b2, "127.0.0.3", sb1.port), Served(t2, "127.0.0.3", st1.port):
            project = parse_project(
                {
                    "hosts": [{"name": "a", "address": "127.0.0.2"}, {"name": "b", "address": "127.0.0.3"}],
                    "engine": {"backend": "sglang", "target": "/models/q35", "draft": "/models/d"},
                    "services": [
                        {"name": "baseline", "algorithm": "dflash", "port": sb1.port},
                        {"name": "tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "port": st1.port},
                    ],
                }
            )
            for parallel_hosts, expected_peak in ((1, 1), (2, 2)):
                peak[0] = 0
                report = run_compare(project, BUILTIN_PROMPTS[:2], runs=2, max_tokens=9, parallel_hosts=parallel_hosts)
                assert report.ok and report.warnings == [], (report.failure_lines(), report.warnings)
                assert peak[0] == expected_peak, f"--parallel-hosts {parallel_hosts}: {peak[0]} generations at once"
                # The report reads the same either way: host a's runs, then host b's, each with its own counters.
                assert [r.host for r in report.runs] == ["a"] * 8 + ["b"] * 8
                assert all(r.accept_length == {"baseline": 2.0, "tree": 4.0}[r.arm] for r in report.runs)
                assert [s.host for s in report.summaries] == ["a", "a", "b", "b"]
