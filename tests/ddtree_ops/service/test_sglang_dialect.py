"""The sglang dialect of the service client, against a loopback server answering in SGLang 0.5.23's shapes.

No real SGLang runs on this CPU machine: `sglang_shapes.FakeSGLang` serves bodies copied from SGLang's source
(each shape cites its file:line there). What is tested is ddtree-ops' reading of those shapes.
"""

from __future__ import annotations

import pytest
from sglang_shapes import FakeSGLang, Served

from ddtree_ops.deploy.gate import GateTarget, wait_healthy
from ddtree_ops.service import server_info
from ddtree_ops.service.client import ServiceClient, base_url
from ddtree_ops.service.dialect import REDACTED, normalize_info
from ddtree_ops.service.metrics_text import accept_length_delta, accept_length_lifetime, running_requests

KEY = "sk-dialect-test-key"


def tree(**kw) -> FakeSGLang:
    return FakeSGLang(model_path="/models/q35", algorithm="DDTREE", draft_path="/models/d", budget=15, topk=8, accept=4, **kw)


def test_server_info_is_read_in_the_contracts_keys_with_the_key_redacted(monkeypatch):
    monkeypatch.setenv("DDTREE_API_KEY", KEY)
    with Served(tree(api_key=KEY)) as served, ServiceClient(base_url("127.0.0.1", served.port), backend="sglang") as c:
        info = c.server_info()
    assert info["speculative_algorithm"] == "DDTREE"
    assert (info["speculative_ddtree_budget"], info["speculative_ddtree_topk"]) == (15, 8)  # from launch_command
    assert info["speculative_ddtree_hybrid_mode"] == "safe" and info["speculative_ddtree_spine_depth"] == 0
    assert info["model_path"] == "/models/q35" and info["version"] == "0.5.23"
    assert KEY not in repr(info), "SGLang's /server_info carries the key in `api_key` and `launch_command`"
    assert info["api_key"] == REDACTED and f"--api-key {REDACTED} --model-path" in info["launch_command"]
    assert served.fake.seen_auth[-1] == f"Bearer {KEY}", "SGLang requires the key on /server_info"
    assert server_info.mismatches(server_info.expected("ddtree", 16, 15, 8, "sglang"), info) == []


def test_the_reference_dialect_would_miss_what_the_sglang_one_reads():
    """The seam matters: read as the reference server, SGLang's /server_info has no tree settings."""
    with Served(tree()) as served, ServiceClient(base_url("127.0.0.1", served.port)) as c:
        info = c.server_info()
    problems = server_info.mismatches(server_info.expected("ddtree", 16, 15, 8), info)
    assert any(p.startswith("speculative_ddtree_budget: server says None") for p in problems), problems


@pytest.mark.parametrize(
    ("budget", "block", "verify_tokens", "shown_block"),
    # equal cost (16 = budget + 1 could hide a smaller block), wider than the block, narrower
    [(15, 16, 16, None), (31, 16, 32, None), (7, 16, 16, 16)],
)
def test_a_ddtree_servers_verify_width_is_checked_under_its_own_key(budget, block, verify_tokens, shown_block):
    fake = FakeSGLang(model_path="/m", algorithm="DDTREE", draft_path="/d", budget=budget, topk=4, block_size=block)
    info = normalize_info("sglang", fake.server_info())
    assert info["speculative_verify_tokens"] == verify_tokens
    assert info["speculative_num_draft_tokens"] == shown_block
    assert server_info.mismatches(server_info.expected("ddtree", block, budget, 4, "sglang"), info) == []
    # The plugin reserving the wrong width (or a drafter whose block exceeds the tree) is caught.
    assert server_info.mismatches(server_info.expected("ddtree", block + 32, budget, 4, "sglang"), info) == [
        f"speculative_verify_tokens: server says {verify_tokens}, deployed {max(block + 32, budget + 1)}"
    ]
    assert server_info.expected("ddtree", block, budget, 4)["speculative_num_draft_tokens"] == block  # reference


def test_a_wrong_drafter_block_size_is_caught_when_the_server_shows_it():
    fake = FakeSGLang(model_path="/m", algorithm="DFLASH", draft_path="/d", block_size=8)
    info = normalize_info("sglang", fake.server_info())
    assert server_info.mismatches(server_info.expected("dflash", 16, None, None, "sglang"), info) == [
        "speculative_num_draft_tokens: server says 8, deployed 16"
    ]


def test_top_level_plugin_fields_win_and_no_speculation_reads_as_ar():
    fake = tree(budget_at_top_level=True)
    raw = fake.server_info()
    raw["speculative_ddtree_budget"] = 7  # what the server resolved beats what it was asked for
    assert normalize_info("sglang", raw)["speculative_ddtree_budget"] == 7
    ar = normalize_info("sglang", FakeSGLang(model_path="/m", algorithm=None).server_info())
    assert server_info.mismatches(server_info.expected("ar", 16, None, None, "sglang"), ar) == []
    assert normalize_info("reference", {"speculative_algorithm": None}) == {"speculative_algorithm": None}


def test_redaction_covers_every_spelling_of_the_key_flag():
    raw = {"launch_command": f"--api-key {KEY} --admin-api-key={KEY}x --port 1", "admin_api_key": KEY}
    info = normalize_info("sglang", raw)
    assert KEY not in repr(info)
    assert info["launch_command"] == f"--api-key {REDACTED} --admin-api-key={REDACTED} --port 1"


def test_metrics_completion_and_acceptance_from_sglangs_counters():
    with Served(tree()) as served, ServiceClient(base_url("127.0.0.1", served.port), backend="sglang") as c:
        before = c.metrics()
        body = c.complete("The capital of France is", 9, model=c.model_id())
        after = c.metrics()
        assert c.health_status() == 200 and c.generation_health_status() == 200
        served.fake.health_generate_status = 503
        assert c.generation_health_status() == 503
    assert body["usage"]["completion_tokens"] == 9 and body["choices"][0]["text"].startswith(" word0")
    # 9 tokens: 1 from the prefill, 8 from 2 verify steps of 4.
    assert accept_length_delta(before, after).value == 4.0
    assert accept_length_lifetime(after).value == 4.0
    assert running_requests(after) == 0.0


def test_running_requests_count_the_total_series_only():
    from ddtree_ops.service.metrics_text import parse_metrics

    text = (
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{model_name="m",priority=""} 3.0\n'
        'sglang:num_running_reqs{model_name="m",priority="0"} 1.0\n'
        'sglang:num_running_reqs{model_name="m",priority="5"} 2.0\n'
    )
    assert running_requests(parse_metrics(text)) == 3.0
    assert running_requests(parse_metrics("# TYPE x gauge\nx 1\n")) is None


def test_reference_backend_has_no_generating_health_check():
    with Served(tree()) as served, ServiceClient(base_url("127.0.0.1", served.port)) as c:
        assert c.generation_health_status() is None


def test_deploy_gate_waits_for_sglangs_warm_up_then_checks_server_info():
    with Served(tree(starting_polls=2)) as served:
        url = base_url("127.0.0.1", served.port)
        want = server_info.expected("ddtree", 16, 15, 8, "sglang")
        ok = wait_healthy([GateTarget("h", "tree", url, want, "sglang")], timeout_s=20, interval_s=0.05)
        assert ok["tree"].healthy, ok["tree"].reason
        assert served.fake.starting_polls == 0, "the gate polled through SGLang's 503s"
        wrong = server_info.expected("ddtree", 16, 7, 8, "sglang")
        bad = wait_healthy([GateTarget("h", "tree", url, wrong, "sglang")], timeout_s=20, interval_s=0.05)
    assert not bad["tree"].healthy
    assert "speculative_ddtree_budget: server says 15, deployed 7" in bad["tree"].reason
