"""The app in-process (fastapi TestClient) over a real tiny ddtree engine."""

from __future__ import annotations

import threading
import time

import pytest
from ddtree_engine.errors import ModelLoadError
from ddtree_engine.reference.engine import load_engine
from ddtree_engine.types import SamplingParams, SpeculativeConfig
from ddtree_engine.server import ServerSettings, create_app
from fastapi.testclient import TestClient
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

PROMPT = "The quick brown fox"


def wait_healthy(client: TestClient, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while client.get("/health").status_code != 200:
        assert time.monotonic() < deadline, client.get("/health").json()
        time.sleep(0.02)


@pytest.fixture(scope="module")
def journal():
    return []


@pytest.fixture(scope="module")
def client(server_engine, journal):
    app = create_app(server_engine, ServerSettings(served_model_name="tiny", metrics_log_interval=1))
    app.state.runtime.metrics._log_sink = journal.append  # see the journal lines without capturing stderr
    with TestClient(app) as c:
        wait_healthy(c)
        yield c


def complete(client, **body):
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_health_is_503_until_the_engine_loaded_and_warmed_up(qwen3_pair):
    target, draft = qwen3_pair
    release = threading.Event()

    def slow_load():
        release.wait(30)
        return load_engine(str(target), str(draft), SpeculativeConfig("ddtree", 3, 2), device="cpu")

    with TestClient(create_app(slow_load, ServerSettings())) as c:
        r = c.get("/health")
        assert (r.status_code, r.json()) == (503, {"status": "warming up"})
        assert c.get("/server_info").json()["warm"] is False
        r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 503 and "warming up" in r.json()["error"]["message"]
        release.set()
        wait_healthy(c)
        assert c.get("/health").json() == {"status": "ok"}
        info = c.get("/server_info").json()
        assert info["warm"] is True
        assert (info["speculative_ddtree_budget"], info["speculative_ddtree_topk"]) == (3, 2)
        # The warm-up generation is not traffic: the counters start at zero.
        assert 'sglang:generation_tokens_total{model_name="lab"} 0.0' in c.get("/metrics").text


def test_a_failed_load_keeps_health_503_with_the_error_and_calls_the_hook(tmp_path):
    failures = []

    def bad_load():
        return load_engine(
            str(tmp_path / "missing"), str(tmp_path / "missing"), SpeculativeConfig("ddtree"), device="cpu"
        )

    with TestClient(create_app(bad_load, ServerSettings(on_load_failure=failures.append))) as c:
        deadline = time.monotonic() + 30
        while not failures:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        r = c.get("/health")
        assert r.status_code == 503
        assert r.json()["status"] == "failed"
        assert "missing" in r.json()["error"]
        assert isinstance(failures[0], ModelLoadError)


def test_server_info_has_the_engine_and_server_fields(client, server_engine):
    info = client.get("/server_info").json()
    for key, value in server_engine.server_info().items():
        assert info[key] == value, key
    assert info["speculative_algorithm"] == "DDTREE"
    assert info["speculative_num_draft_tokens"] == 16
    assert (info["served_model_name"], info["metrics_log_interval"], info["warm"]) == ("tiny", 1, True)


def test_models_lists_the_served_name(client):
    data = client.get("/v1/models").json()["data"]
    assert [m["id"] for m in data] == ["tiny"]


def test_completion_tokens_are_the_engines_tokens(client, server_engine):
    body = complete(client)
    prompt_ids = server_engine.tokenizer.encode(PROMPT, add_special_tokens=False)
    direct = server_engine.generate(prompt_ids, SamplingParams(max_new_tokens=12, temperature=0.0))
    stats = body["ddtree"]
    assert stats["completion_token_ids"] == direct.token_ids
    assert body["usage"] == {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": len(direct.token_ids),
        "total_tokens": len(prompt_ids) + len(direct.token_ids),
    }
    assert stats["verify_steps"] == len(direct.steps) == len(stats["accepted_per_step"])
    assert stats["accepted_per_step"] == direct.accepted_per_step
    choice = body["choices"][0]
    assert choice["text"] == server_engine.tokenizer.decode(direct.token_ids, skip_special_tokens=True)
    assert choice["finish_reason"] == direct.finish_reason
    assert body["object"] == "text_completion" and body["model"] == "tiny"


def test_prompt_as_token_ids_matches_prompt_as_text(client, server_engine):
    ids = server_engine.tokenizer.encode(PROMPT, add_special_tokens=False)
    assert complete(client, prompt=ids)["ddtree"] == complete(client)["ddtree"]
    assert complete(client, prompt=[ids])["ddtree"] == complete(client)["ddtree"]


def test_streamed_completion_matches_the_plain_one(client, parse_sse):
    plain = complete(client)
    r = client.post(
        "/v1/completions",
        json={
            "prompt": PROMPT,
            "max_tokens": 12,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == plain["usage"]
    assert usage_chunk["ddtree"] == plain["ddtree"]
    chunks = events[:-2]
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == plain["choices"][0]["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_stream_without_include_usage_has_no_usage_chunk(client, parse_sse):
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True})
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    assert all("usage" not in e and e["choices"] for e in events[:-1])


def test_chat_uses_the_chat_template(client, server_engine, parse_sse):
    messages = [{"role": "user", "content": "hi"}]
    text = server_engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_ids = server_engine.tokenizer.encode(text, add_special_tokens=False)
    direct = server_engine.generate(prompt_ids, SamplingParams(max_new_tokens=8, temperature=0.0))

    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 8, "temperature": 0})
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["usage"]["prompt_tokens"] == len(prompt_ids)
    assert body["ddtree"]["completion_token_ids"] == direct.token_ids
    message = body["choices"][0]["message"]
    assert message == {
        "role": "assistant",
        "content": server_engine.tokenizer.decode(direct.token_ids, skip_special_tokens=True),
    }

    r = client.post(
        "/v1/chat/completions",
        json={
            "messages": messages,
            "max_tokens": 8,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    events = parse_sse(r.text)
    assert events[0]["object"] == "chat.completion.chunk"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2]) == message["content"]
    assert events[-2]["usage"] == body["usage"]


def _output_with(client, predicate):
    """The first 24-token T=0 output (over a few prompts) that `predicate(text, ids)` accepts."""
    for prompt in ("The quick brown fox", "hello world", "Once upon a time", "a", "1, 2, 3"):
        body = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 24, "temperature": 0}).json()
        found = predicate(body["choices"][0]["text"], body["ddtree"]["completion_token_ids"])
        if found is not None:
            return prompt, body, found
    pytest.fail("no prompt produced a usable output for this test")


def test_a_single_token_stop_ends_generation(client):
    def printable_at_3_or_later(_text, ids):
        return next((i for i, t in enumerate(ids) if i >= 3 and 33 <= t < 127), None)

    prompt, full, index = _output_with(client, printable_at_3_or_later)
    stop_id = full["ddtree"]["completion_token_ids"][index]
    first = full["ddtree"]["completion_token_ids"].index(stop_id)
    stop = chr(stop_id)  # the tiny tokenizer is byte-level: ids < 256 are bytes
    body = client.post(
        "/v1/completions", json={"prompt": prompt, "max_tokens": 24, "temperature": 0, "stop": stop}
    ).json()
    assert body["ddtree"]["completion_token_ids"] == full["ddtree"]["completion_token_ids"][: first + 1]
    assert body["usage"]["completion_tokens"] == first + 1
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["choices"][0]["text"] == full["choices"][0]["text"].split(stop)[0]


def test_a_multi_token_stop_cuts_the_text_and_stops_generating(client, parse_sse):
    def printable_pair(text, _ids):
        for i in range(2, len(text) - 1):
            if text[i].isalnum() and text[i + 1].isalnum():
                return text[i : i + 2]
        return None

    prompt, full, stop = _output_with(client, printable_pair)
    req = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "stop": [stop]}
    body = client.post("/v1/completions", json=req).json()
    expected = full["choices"][0]["text"].split(stop)[0]
    assert body["choices"][0]["text"] == expected
    assert body["choices"][0]["finish_reason"] == "stop"
    # Generation stops at the verify step that completes the stop string (not at max_tokens),
    # and usage counts exactly what was generated.
    ids, full_ids = body["ddtree"]["completion_token_ids"], full["ddtree"]["completion_token_ids"]
    assert ids == full_ids[: len(ids)] and len(ids) < len(full_ids)
    assert body["usage"]["completion_tokens"] == len(ids)

    events = parse_sse(client.post("/v1/completions", json={**req, "stream": True, "stream_options": {"include_usage": True}}).text)
    assert "".join(e["choices"][0]["text"] for e in events[:-2]) == expected
    assert events[-3]["choices"][0]["finish_reason"] == "stop"
    assert events[-2]["usage"]["completion_tokens"] == len(ids)


def test_a_seed_makes_sampling_repeatable(client):
    a = complete(client, temperature=0.9, seed=7)
    b = complete(client, temperature=0.9, seed=7)
    assert a["ddtree"]["completion_token_ids"] == b["ddtree"]["completion_token_ids"]


def test_metrics_grow_by_exactly_the_request_and_journal_lines_follow_steps(client, journal, parse_metrics):
    before = parse_metrics(client.get("/metrics").text)
    lines_before = len(journal)
    body = complete(client)
    after = parse_metrics(client.get("/metrics").text)
    stats = body["ddtree"]

    def delta(name):
        return after[name] - before[name]

    assert delta("sglang:generation_tokens_total") == body["usage"]["completion_tokens"]
    assert delta("sglang:prompt_tokens_total") == body["usage"]["prompt_tokens"]
    assert delta("sglang:num_requests_total") == 1
    assert delta("sglang:spec_verify_calls_total") == stats["verify_steps"]
    assert delta("ddtree:tree_nodes_total") == sum(stats["tree_nodes_per_step"])
    assert delta("ddtree:accepted_drafts_total") == sum(stats["accepted_drafts_per_step"])
    assert delta("ddtree:verify_committed_tokens_total") == sum(stats["accepted_per_step"])
    # Acceptance excludes each request's prefill token: (generated - requests) / verify steps.
    assert after["sglang:spec_accept_length"] == pytest.approx(
        (after["sglang:generation_tokens_total"] - after["sglang:num_requests_total"])
        / after["sglang:spec_verify_calls_total"]
    )
    new_lines = journal[lines_before:]
    assert len(new_lines) == stats["verify_steps"]  # interval 1: one line per verify step
    assert all(line.startswith("DDTREE metrics: bs=1 budget=15 avg_actual_nodes=") for line in new_lines)
    assert new_lines[0].endswith(
        f"avg_commit_len={stats['accepted_per_step'][0]:.2f} "
        f"avg_accepted_depth={stats['accepted_drafts_per_step'][0]:.2f}"
    )


def test_metrics_answer_as_prometheus_clients_asgi_app_does(client, server_engine):
    complete(client)
    # Nothing asked for: text 0.0.4, the format SGLang's /metrics answers curl and httpx with.
    r = client.get("/metrics")
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    text_families = {f.name: f for f in text_string_to_metric_families(r.text)}
    # A scraper that asks for OpenMetrics (Prometheus does) gets it, with the same samples. Compared
    # with ':' read as '_': with `escaping=underscores` prometheus_client 0.26 writes sample names
    # with '_' but HELP/TYPE with ':' (prometheus/client_python#1177), as SGLang's /metrics does.
    r = client.get("/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})
    assert r.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert r.text.endswith("# EOF\n")

    # The in-flight gauges are read per scrape and may move between the two (a request of an earlier
    # test finishing late under load once did): present in both, compared by name only.
    live = {"sglang_num_running_reqs", "sglang_num_queue_reqs"}

    def samples(families):
        return sorted(
            (s.name.replace(":", "_"), s.labels, None if s.name.replace(":", "_") in live else s.value)
            for f in families
            for s in f.samples
        )

    assert samples(openmetrics_families(r.text)) == samples(text_families.values())
    assert live <= {name for name, _, _ in samples(text_families.values())}
    # Each app has its own registry: a second app in this process reads its own (zero) counters.
    other = TestClient(create_app(server_engine, ServerSettings(served_model_name="other")))  # no lifespan: never warms
    theirs = {s.name: s for f in text_string_to_metric_families(other.get("/metrics").text) for s in f.samples}
    ours = {s.name: s for f in text_families.values() for s in f.samples}
    assert ours["sglang:num_requests_total"].value >= 1 and ours["sglang:num_requests_total"].labels == {"model_name": "tiny"}
    assert theirs["sglang:num_requests_total"].value == 0 and theirs["sglang:num_requests_total"].labels == {"model_name": "other"}


def test_concurrent_requests_are_serialised_and_each_gets_its_own_tokens(client):
    expected = complete(client)["ddtree"]["completion_token_ids"]
    results = []

    def worker():
        results.append(complete(client)["ddtree"]["completion_token_ids"])

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 3


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens", "max_tokens must be >= 1"),
        ({"prompt": "hi", "temperature": -0.5}, "temperature", "temperature must be >= 0"),
        ({"prompt": "", "max_tokens": 2}, "prompt", "prompt is empty"),
        ({"prompt": [], "max_tokens": 2}, "prompt", "prompt is empty"),
        ({"prompt": [1, 999999], "max_tokens": 2}, "prompt", "token ids must be in"),
        ({"prompt": ["a", "b"], "max_tokens": 2}, "prompt", "batched prompts"),
        ({"prompt": "hi", "n": 2}, "n", "n must be 1"),
        ({"max_tokens": 2}, "prompt", "prompt: Field required"),
    ],
)
def test_bad_completion_params_are_400_with_an_openai_error(client, body, param, needle):
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert needle in error["message"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_bad_chat_params_are_400(client):
    r = client.post("/v1/chat/completions", json={"messages": [], "max_tokens": 2})
    assert r.status_code == 400 and "messages is empty" in r.json()["error"]["message"]
    r = client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_api_key_guards_v1_only(server_engine):
    settings = ServerSettings(api_key="s3cret")
    assert "s3cret" not in repr(settings) and "s3cret" not in str(settings), "settings may be logged; the key never"
    app = create_app(server_engine, settings)
    with TestClient(app) as c:
        wait_healthy(c)
        req = {"prompt": "hi", "max_tokens": 2, "temperature": 0}
        r = c.post("/v1/completions", json=req)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert c.post("/v1/completions", json=req, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/v1/models").status_code == 401
        assert c.post("/v1/completions", json=req, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert c.get("/metrics").status_code == 200
        assert c.get("/server_info").status_code == 200


def test_null_optional_fields_take_openai_defaults(client):
    body = {"prompt": "hi", "max_tokens": 3, "temperature": None, "stream": None, "n": None, "stop": None, "seed": 1}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == len(r.json()["ddtree"]["completion_token_ids"])


def test_a_factory_that_returns_no_engine_fails_the_load_with_what_is_missing():
    failures = []

    class NoEngine:
        tokenizer = None

        def generate(self, prompt_ids, params, on_tokens=None):
            raise AssertionError("never called: the server checks the Protocol first")

    with TestClient(create_app(NoEngine, ServerSettings(on_load_failure=failures.append))) as c:
        deadline = time.monotonic() + 30
        while not failures:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        body = c.get("/health").json()
    assert isinstance(failures[0], TypeError)
    assert body["status"] == "failed"
    assert "NoEngine, which is not an Engine: it lacks chat_prompt_ids, server_info" in body["error"]


def test_create_app_refuses_what_is_neither_an_engine_nor_a_factory():
    with pytest.raises(TypeError, match="expected an engine or a callable returning one, got 42"):
        create_app(42)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": True}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ],
)
def test_a_model_the_server_does_not_serve_is_404_model_not_found(client, path, body):
    r = client.post(path, json={**body, "model": "gpt-4o", "temperature": 0})
    assert r.status_code == 404
    assert r.headers["content-type"].startswith("application/json")  # not an event stream, even for stream=True
    assert r.json() == {
        "error": {
            "message": "the model 'gpt-4o' does not exist: this server serves 'tiny' (GET /v1/models lists it)",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }


def test_the_served_name_the_target_path_or_no_model_are_served(client, server_engine):
    plain = complete(client)  # no "model": OpenAI requires one, vLLM serves its only model; so do we
    for model in ("tiny", server_engine.model_path):
        body = complete(client, model=model)
        assert body["model"] == "tiny" and body["ddtree"] == plain["ddtree"]
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                                  "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    # Close is not equal: a differently spelt name is refused like any other.
    assert client.post("/v1/completions", json={"model": "Tiny", "prompt": "hi", "max_tokens": 2}).status_code == 404
