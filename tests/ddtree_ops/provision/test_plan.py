"""`provision --plan`: locks side by side, from recorded facts or a live probe; nothing is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtree_ops.provision import plan
from ddtree_ops.config import Project
from ddtree_ops.exceptions import ConfigError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"


def project(backend: str = "sglang", extra_args: list[str] | None = None) -> Project:
    return Project.model_validate(
        {
            "hosts": [
                {"name": "h200", "address": "127.0.0.1", "ssh": {"port": 9}},
                {"name": "rtx", "address": "127.0.0.1", "ssh": {"port": 9}},
            ],
            "engine": {"backend": backend, "target": "/models/Qwen3.5-27B", "draft": "/models/dflash"},
            "services": [
                {"name": "baseline", "algorithm": "dflash", "port": 30000, "extra_args": extra_args or []},
                {"name": "tree", "algorithm": "ddtree", "port": 30001, "budget": 15, "topk": 8},
            ],
        }
    )


def test_plan_from_recorded_facts_gives_a_lock_per_host_side_by_side():
    p = project()
    results = [
        plan.plan_hosts(p, [p.host("h200")], facts_file=str(FIXTURES / "h200-probe.json"))[0],
        plan.plan_hosts(p, [p.host("rtx")], facts_file=str(FIXTURES / "rtx6000-570-probe.json"))[0],
    ]
    assert results[0].ok and results[0].lock.cuda_flavour == "cu130"
    assert not results[1].ok and results[1].refusal.codes == ("driver-too-old",)
    table = plan.render_side_by_side(results)
    header, *rows = table.splitlines()
    assert header.split() == ["h200", "rtx"]
    assert any(r.startswith("CUDA flavour") and "cu130 (native)" in r for r in rows)
    assert "rtx: refused: sglang 0.5.23 ships kernel wheels for cu130 only" in table
    assert plan.plan_exit_code(results) == 1
    doc = plan.plan_document(results)
    assert doc["ok"] is False and doc["hosts"][0]["lock"]["short_hash"] == results[0].lock.short_hash


def test_attention_backend_from_service_args_is_checked_per_host():
    p = project(extra_args=["--attention-backend", "fa3"])
    (h200,) = plan.plan_hosts(p, [p.host("h200")], facts_file=str(FIXTURES / "h200-probe.json"))
    (rtx,) = plan.plan_hosts(p, [p.host("rtx")], facts_file=str(FIXTURES / "rtx6000-580-probe.json"))
    assert h200.ok and h200.lock.attention_backend == "fa3"
    assert not rtx.ok and "FA3 covers sm_80–sm_90 only" in rtx.refusal.message


def test_bad_facts_file_is_a_usage_error_before_any_probe():
    p = project()
    probed = []
    with pytest.raises(ConfigError, match="cannot read it"):
        plan.plan_hosts(p, [p.host("h200")], facts_file="/nonexistent/facts.json", probe=lambda h: probed.append(h))
    assert probed == []


def test_unreachable_host_is_reported_not_raised():
    p = project()
    (result,) = plan.plan_hosts(p, [p.host("h200")])
    assert not result.ok and "unreachable over SSH" in result.error
    assert "h200: host h200 (root@127.0.0.1:9) is unreachable" in plan.render_side_by_side([result])


def test_facts_file_describes_exactly_one_host():
    p = project()
    with pytest.raises(ConfigError, match="describes one host"):
        plan.plan_hosts(p, p.hosts, facts_file=str(FIXTURES / "h200-probe.json"))


def test_lock_for_provision_raises_the_refusal_as_a_host_error():
    from ddtree_ops.exceptions import HostError

    p = project()
    facts = plan.load_facts(FIXTURES / "nvml-mismatch-probe.json")
    with pytest.raises(HostError, match="host rtx: no environment can be built: .*reboot the host"):
        plan.lock_for_provision(p, p.host("rtx"), facts)
    assert plan.lock_for_provision(p, p.host("h200"), plan.load_facts(FIXTURES / "h200-probe.json")).cuda_flavour == "cu130"


def _provision_like_command():
    """A stand-in for `provision` wired exactly as cli/provision.py is asked to wire --plan."""
    import click

    from ddtree_ops.cli.common import DdtreeGroup, json_option
    from ddtree_ops.cli.plan import handle_plan, plan_options

    @click.group(cls=DdtreeGroup)
    def root():
        pass

    @root.command()
    @click.argument("host_names", nargs=-1)
    @plan_options
    @json_option
    @click.pass_context
    def provision(ctx, host_names, plan, facts_file, gpu_archs, json_):
        p = project()
        hosts = p.select_hosts(host_names)
        if handle_plan(ctx, p, hosts, plan, facts_file, gpu_archs, json_):
            return
        click.echo("would provision")

    return root


def test_provision_plan_cli_wiring():
    import json as _json

    from click.testing import CliRunner

    root = _provision_like_command()
    run = lambda *a: CliRunner().invoke(root, list(a), catch_exceptions=False)  # noqa: E731
    ok = run("provision", "h200", "--plan", "--facts", str(FIXTURES / "h200-probe.json"), "--json")
    assert ok.exit_code == 0 and _json.loads(ok.stdout)["hosts"][0]["lock"]["cuda_flavour"] == "cu130"
    refused = run("provision", "rtx", "--plan", "--facts", str(FIXTURES / "a100-535-probe.json"))
    assert refused.exit_code == 1 and "rtx: refused: sglang 0.5.23 needs Python" in refused.stdout
    bad = run("provision", "rtx", "--plan", "--facts", "/nonexistent.json")
    assert bad.exit_code == 2 and "cannot read it" in bad.stderr
    assert run("provision", "--facts", "x.json").exit_code == 2  # --facts without --plan
    assert run("provision").stdout.strip() == "would provision"


def test_engine_sglang_version_is_validated_up_front_and_used_by_the_plan():
    from pydantic import ValidationError

    data = project().model_dump()
    data["engine"]["sglang_version"] = "0.5.6"
    p = Project.model_validate(data)
    (result,) = plan.plan_hosts(p, [p.host("h200")], facts_file=str(FIXTURES / "a100-535-probe.json"))
    assert result.ok and result.lock.sglang_version == "0.5.6" and result.lock.driver_mode == "minor-version-compat"
    data["engine"]["sglang_version"] = "9.9.9"
    with pytest.raises(ValidationError, match="sglang 9.9.9 is not a release ddtree-ops has data for"):
        Project.model_validate(data)
