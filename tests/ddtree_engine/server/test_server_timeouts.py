"""The per-request timeout, in-process over a real tiny engine: a request past it is answered 504
(or, once streaming, ends with a timeout event), counted, and the engine is freed at its next step."""

from __future__ import annotations

import threading
import time

import pytest
from ddtree_engine.server import ServerSettings, create_app
from fastapi.testclient import TestClient

TIMEOUT_S = 0.5
LONG = 3000  # tokens: several seconds on this engine, far past the timeout


@pytest.fixture(scope="module")
def client(server_engine):
    settings = ServerSettings(served_model_name="tiny", request_timeout_s=TIMEOUT_S, max_queue=1)
    with TestClient(create_app(server_engine, settings)) as c:
        deadline = time.monotonic() + 30
        while c.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        yield c


def idle_metrics(client, parse_metrics, timeout_s: float = 30.0) -> dict[str, float]:
    """/metrics once nothing runs or waits any more."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = parse_metrics(client.get("/metrics").text)
        if m["sglang:num_running_reqs"] == 0 and m["sglang:num_queue_reqs"] == 0:
            return m
        assert time.monotonic() < deadline, m
        time.sleep(0.05)


def test_a_long_request_and_the_one_queued_behind_it_get_504s_and_the_engine_is_freed(client, parse_metrics):
    before = idle_metrics(client, parse_metrics)
    answers: dict[str, object] = {}

    def post(name, delay_s):
        time.sleep(delay_s)
        answers[name] = client.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": LONG,
                                                              "temperature": 0})

    threads = [threading.Thread(target=post, args=("first", 0)), threading.Thread(target=post, args=("queued", 0.15))]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    elapsed = time.monotonic() - started
    # The first is cut while generating. The second arrived later, so its deadline is later too:
    # the engine, freed at the first's deadline, reaches it before its own (the queue-phase
    # timeout is covered in test_server_admission.py).
    for name in ("first", "queued"):
        r = answers[name]
        assert r.status_code == 504, (name, r.text)
        error = r.json()["error"]
        assert error["message"].startswith(
            f"the request did not finish within the server's {TIMEOUT_S:g}s request timeout ("
        ) and error["message"].endswith("retry later, ask for fewer max_tokens, or raise --request-timeout")
        assert (error["type"], error["param"], error["code"]) == ("timeout_error", None, "request_timeout")
    assert "(generating)" in answers["first"].json()["error"]["message"]
    assert elapsed < 10  # answered at the deadline, not after the LONG generation

    after = idle_metrics(client, parse_metrics)
    assert after["ddtree:request_timeouts_total"] - before["ddtree:request_timeouts_total"] == 2
    # The first request's generation was cut at the deadline: far fewer than LONG tokens made.
    made = after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"]
    assert 0 < made < LONG / 2
    # The engine serves the next request normally.
    r = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_a_streamed_request_past_the_timeout_ends_with_a_timeout_event(client, parse_sse, parse_metrics):
    before = idle_metrics(client, parse_metrics)
    r = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": LONG, "temperature": 0, "stream": True},
    )
    assert r.status_code == 200
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "request_timeout" and events[-2]["error"]["type"] == "timeout_error"
    assert all("error" not in e for e in events[:-2])
    after = idle_metrics(client, parse_metrics)
    assert after["ddtree:request_timeouts_total"] - before["ddtree:request_timeouts_total"] == 1
    assert after["ddtree:client_disconnects_total"] == before["ddtree:client_disconnects_total"]
    assert after["sglang:generation_tokens_total"] - before["sglang:generation_tokens_total"] < LONG / 2
