"""`python -m ddtree_engine.cli serve` as a real process on a free port, checked endpoint by endpoint."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

API_KEY = "test-key"
BUDGET, TOPK = 7, 3
JOURNAL_LINE = re.compile(
    r"^DDTREE metrics: bs=1 budget=7 avg_actual_nodes=\d+\.\d\d avg_accepted_drafts=\d+\.\d\d "
    r"avg_commit_len=\d+\.\d\d avg_accepted_depth=\d+\.\d\d$"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_env() -> dict[str, str]:
    src = Path(__file__).resolve().parents[3] / "engine_patches" / "ddtree_engine" / "src"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    env["DDTREE_API_KEY"] = API_KEY
    return env


def first_answer(url: str, proc: subprocess.Popen, timeout_s: float = 90.0) -> httpx.Response:
    """The first response once the port accepts connections."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the server exited before it answered"
        try:
            return httpx.get(url, timeout=5)
        except httpx.TransportError:
            time.sleep(0.05)
    pytest.fail(f"{url} did not answer within {timeout_s}s")


@pytest.fixture(scope="module")
def server(qwen3_pair, tmp_path_factory):
    """A running server (ddtree, budget 7, topk 3); yields (base url, stderr path, process)."""
    target, draft = qwen3_pair
    port = free_port()
    stderr_path = tmp_path_factory.mktemp("serve") / "stderr.log"
    cmd = [
        sys.executable,
        "-m",
        "ddtree_engine.cli",
        "serve",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--algorithm",
        "ddtree",
        "--budget",
        str(BUDGET),
        "--topk",
        str(TOPK),
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--port",
        str(port),
        "--served-model-name",
        "tiny-qwen3",
        "--metrics-log-interval",
        "1",
        "--log-level",
        "warning",
        "--warmup-delay",
        "1.5",
    ]
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, env=engine_env())
    base = f"http://127.0.0.1:{port}"
    try:
        yield base, stderr_path, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def warm_server(server):
    """The server after /health was seen answering 503 and then 200."""
    base, stderr_path, proc = server
    first = first_answer(f"{base}/health", proc)
    assert (first.status_code, first.json()) == (503, {"status": "warming up"}), stderr_path.read_text()
    deadline = time.monotonic() + 90
    while (r := httpx.get(f"{base}/health", timeout=5)).status_code != 200:
        assert r.status_code == 503 and time.monotonic() < deadline, (r.text, stderr_path.read_text())
        time.sleep(0.1)
    assert r.json() == {"status": "ok"}
    return server


@pytest.fixture(scope="module")
def api(warm_server):
    base = warm_server[0]
    with httpx.Client(base_url=base, timeout=60, headers={"Authorization": f"Bearer {API_KEY}"}) as client:
        yield client


def test_server_info_reports_what_was_requested(api):
    info = api.get("/server_info").json()
    assert info["speculative_algorithm"] == "DDTREE"
    assert info["speculative_ddtree_budget"] == BUDGET
    assert info["speculative_ddtree_topk"] == TOPK
    assert info["speculative_num_draft_tokens"] == 16  # the tiny drafter's block size
    assert info["served_model_name"] == "tiny-qwen3"
    assert info["port"] == int(api.base_url.port)
    assert info["metrics_log_interval"] == 1
    assert info["warm"] is True
    assert info["model_path"].endswith("target")


def test_models_and_the_api_key(api, warm_server):
    assert [m["id"] for m in api.get("/v1/models").json()["data"]] == ["tiny-qwen3"]
    r = httpx.get(f"{warm_server[0]}/v1/models")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_usage_metrics_and_journal_agree_on_every_generated_token(api, warm_server, parse_sse, parse_metrics):
    _base, stderr_path, _proc = warm_server
    request = {"model": "tiny-qwen3", "prompt": "Once upon a time", "max_tokens": 20, "temperature": 0}

    m0 = parse_metrics(api.get("/metrics").text)
    plain = api.post("/v1/completions", json=request).json()
    m1 = parse_metrics(api.get("/metrics").text)
    r = api.post("/v1/completions", json={**request, "stream": True, "stream_options": {"include_usage": True}})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    m2 = parse_metrics(api.get("/metrics").text)

    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    streamed = usage_chunk["usage"]
    generated = len(plain["ddtree"]["completion_token_ids"])
    assert plain["usage"]["completion_tokens"] == generated
    # Same seedless T=0 request: the streamed one generated the same tokens, and counted them.
    assert streamed == plain["usage"]
    assert usage_chunk["ddtree"]["completion_token_ids"] == plain["ddtree"]["completion_token_ids"]
    assert "".join(e["choices"][0]["text"] for e in events[:-2]) == plain["choices"][0]["text"]

    for before, after, body in ((m0, m1, plain), (m1, m2, usage_chunk)):
        assert (
            after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"]
            == body["usage"]["completion_tokens"]
        )
        assert (
            after["sglang:spec_verify_calls_total"] - before["sglang:spec_verify_calls_total"]
            == body["ddtree"]["verify_steps"]
        )
        assert (
            after["sglang:prompt_tokens_total"] - before["sglang:prompt_tokens_total"] == body["usage"]["prompt_tokens"]
        )
        assert after["sglang:num_requests_total"] - before["sglang:num_requests_total"] == 1
    assert plain["ddtree"]["verify_steps"] >= 1

    # --metrics-log-interval 1: one journal line per verify step served (the warm-up is not served).
    deadline = time.monotonic() + 10
    while True:
        lines = [l for l in stderr_path.read_text().splitlines() if l.startswith("DDTREE metrics:")]
        if len(lines) >= m2["sglang:spec_verify_calls_total"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(lines) == m2["sglang:spec_verify_calls_total"]
    assert all(JOURNAL_LINE.match(l) for l in lines), lines[:3]


def test_chat_streams_with_usage(api, parse_sse):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0}
    plain = api.post("/v1/chat/completions", json=body).json()
    events = parse_sse(
        api.post("/v1/chat/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}).text
    )
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-2]["usage"] == plain["usage"]
    assert plain["usage"]["completion_tokens"] == len(plain["ddtree"]["completion_token_ids"])
    assert (
        "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2])
        == plain["choices"][0]["message"]["content"]
    )


def test_bad_params_are_400(api):
    r = api.post("/v1/completions", json={"prompt": "hi", "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_a_model_that_does_not_load_exits_non_zero_with_the_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddtree_engine.cli",
            "serve",
            "--target",
            str(empty),
            "--draft",
            str(empty),
            "--port",
            str(free_port()),
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        env=engine_env(),
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert "the engine failed to load" in proc.stderr
    assert str(empty) in proc.stderr


def test_stderr_says_once_where_it_listens_and_shows_no_loading_bar(warm_server):
    base, stderr_path, _proc = warm_server
    log = stderr_path.read_text()
    # Written at --log-level warning too: uvicorn says nothing about a socket handed to it.
    expected = f"serving on {base} (model tiny-qwen3); /health answers 503 until the model is loaded and warm"
    assert log.splitlines().count(expected) == 1, log
    assert "Loading weights" not in log and "note: the lab pair" not in log, log


def test_a_request_for_another_model_is_404_and_the_served_one_is_answered(api):
    r = api.post("/v1/completions", json={"model": "gpt-4o", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 404
    assert r.json()["error"] == {
        "message": "the model 'gpt-4o' does not exist: this server serves 'tiny-qwen3' (GET /v1/models lists it)",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    served = api.get("/v1/models").json()["data"][0]["id"]
    assert api.post("/v1/completions", json={"model": served, "prompt": "hi", "max_tokens": 2}).status_code == 200
