"""Every request field, checked: a bad one is a 4xx with an OpenAI-style body naming it, never a 500.

In-process (fastapi TestClient) over a real tiny engine (byte-level tokenizer: 260 ids, context 4096).
"""

from __future__ import annotations

import json
import random
import time

import pytest
from ddtree_engine.server import ServerSettings, create_app
from fastapi.testclient import TestClient

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]
CONTEXT = 4096  # the tiny target's max_position_embeddings


@pytest.fixture(scope="module")
def client(server_engine):
    app = create_app(server_engine, ServerSettings(served_model_name="tiny"))
    with TestClient(app) as c:
        deadline = time.monotonic() + 30
        while c.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        yield c


def comp(**fields):
    return {"prompt": "hi", "max_tokens": 2, **fields}


def chat(**fields):
    return {"messages": USER, "max_tokens": 2, **fields}


# (name, path, body, status, param, code, words the message must contain)
BAD = [
    # sampling parameters out of range
    ("temperature above 2", COMP, comp(temperature=7), 400, "temperature", None, "temperature must be in [0, 2], got 7"),
    ("temperature negative", CHAT, chat(temperature=-0.5), 400, "temperature", None, "temperature must be >= 0"),
    ("temperature a string", COMP, comp(temperature="hot"), 400, "temperature", None, "valid number"),
    ("temperature a bool", COMP, comp(temperature=True), 400, "temperature", None, "valid number"),
    ("top_p 7 (the issue's case)", COMP, comp(top_p=7), 400, "top_p", None, "top_p must be in (0, 1], got 7"),
    ("top_p 0", CHAT, chat(top_p=0), 400, "top_p", None, "top_p must be in (0, 1]"),
    ("top_p below 1 when sampling", COMP, comp(top_p=0.9, temperature=0.7), 400, "top_p", "unsupported_parameter",
     "full distribution"),
    ("top_k -5", COMP, comp(top_k=-5), 400, "top_k", None, "top_k must be -1 or 0 (off) or >= 1"),
    ("top_k 1.5", COMP, comp(top_k=1.5), 400, "top_k", None, "valid integer"),
    ("top_k when sampling", CHAT, chat(top_k=40, temperature=1), 400, "top_k", "unsupported_parameter", "send -1"),
    ("min_p 2", COMP, comp(min_p=2), 400, "min_p", None, "min_p must be in [0, 1]"),
    ("presence_penalty 3", COMP, comp(presence_penalty=3), 400, "presence_penalty", None, "[-2, 2]"),
    ("presence_penalty 0.5", CHAT, chat(presence_penalty=0.5), 400, "presence_penalty", "unsupported_parameter",
     "no penalties"),
    ("frequency_penalty -2.5", CHAT, chat(frequency_penalty=-2.5), 400, "frequency_penalty", None, "[-2, 2]"),
    ("frequency_penalty 1", COMP, comp(frequency_penalty=1), 400, "frequency_penalty", "unsupported_parameter",
     "no penalties"),
    ("repetition_penalty 0", COMP, comp(repetition_penalty=0), 400, "repetition_penalty", None, "(0, 2]"),
    ("repetition_penalty 1.2", COMP, comp(repetition_penalty=1.2), 400, "repetition_penalty",
     "unsupported_parameter", "send 1"),
    ("logit_bias", COMP, comp(logit_bias={"5": 10}), 400, "logit_bias", "unsupported_parameter", "send {}"),
    ("seed beyond 64 bits", COMP, comp(seed=2**64), 400, "seed", None, "seed must be in"),
    ("seed a float", COMP, comp(seed=1.5), 400, "seed", None, "valid integer"),
    # max_tokens
    ("max_tokens 0", COMP, comp(max_tokens=0), 400, "max_tokens", None, "max_tokens must be >= 1"),
    ("max_tokens a string", COMP, comp(max_tokens="5"), 400, "max_tokens", None, "valid integer"),
    ("max_tokens 2.0", CHAT, chat(max_tokens=2.0), 400, "max_tokens", None, "valid integer"),
    ("max_tokens beyond the context", COMP, comp(max_tokens=CONTEXT), 400, "max_tokens", "context_length_exceeded",
     f"lower max_tokens to at most {CONTEXT - 2}"),
    ("max_completion_tokens -1", CHAT, chat(max_completion_tokens=-1), 400, "max_tokens", None, ">= 1"),
    # n and the other options this server cannot honour
    ("n 2", COMP, comp(n=2), 400, "n", "unsupported_parameter", "n must be 1"),
    ("n 0", CHAT, chat(n=0), 400, "n", None, "n must be >= 1"),
    ("best_of 3", COMP, comp(best_of=3), 400, "best_of", "unsupported_parameter", "batch size 1"),
    ("completion logprobs", COMP, comp(logprobs=2), 400, "logprobs", "unsupported_parameter", "log-probabilities"),
    ("chat logprobs", CHAT, chat(logprobs=True), 400, "logprobs", "unsupported_parameter", "log-probabilities"),
    ("chat top_logprobs", CHAT, chat(top_logprobs=3), 400, "top_logprobs", "unsupported_parameter", "omit it"),
    ("echo", COMP, comp(echo=True), 400, "echo", "unsupported_parameter", "send false"),
    ("suffix", COMP, comp(suffix="end"), 400, "suffix", "unsupported_parameter", "omit it"),
    ("tools", CHAT, chat(tools=[{"type": "function"}]), 400, "tools", "unsupported_parameter", "does not call tools"),
    ("json mode", CHAT, chat(response_format={"type": "json_object"}), 400, "response_format",
     "unsupported_parameter", "plain text only"),
    # stream and stop
    ("stream a string", COMP, comp(stream="yes"), 400, "stream", None, "valid boolean"),
    ("include_usage a string", COMP, comp(stream=True, stream_options={"include_usage": "yes"}), 400,
     "stream_options.include_usage", None, "true or false"),
    ("stream_options a list", COMP, comp(stream_options=[1]), 400, "stream_options", None, "valid dictionary"),
    ("stop an int", COMP, comp(stop=5), 400, "stop", None, "valid string"),
    ("stop empty", COMP, comp(stop=[""]), 400, "stop", None, "stop strings must be non-empty"),
    # the model
    ("unknown model", COMP, comp(model="gpt-4o"), 404, "model", "model_not_found", "does not exist"),
    ("model a number", CHAT, chat(model=4), 400, "model", None, "valid string"),
    # prompts
    ("prompt missing", COMP, {"max_tokens": 2}, 400, "prompt", None, "prompt: Field required"),
    ("prompt an int", COMP, comp(prompt=5), 400, "prompt", None, "prompt must be a string or token ids, got int"),
    ("prompt an object", COMP, comp(prompt={"text": "hi"}), 400, "prompt", None, "got dict"),
    ("prompt empty", COMP, comp(prompt=""), 400, "prompt", None, "prompt is empty"),
    ("token id outside the vocabulary", COMP, comp(prompt=[1, 260]), 400, "prompt", None,
     "token ids must be in [0, 260), got [260]"),
    ("negative token id", COMP, comp(prompt=[[-1]]), 400, "prompt", None, "got [-1]"),
    ("float token ids", COMP, comp(prompt=[1.0, 2.0]), 400, "prompt", None, "must be integers, got 1.0"),
    ("bool token ids", COMP, comp(prompt=[True]), 400, "prompt", None, "must be integers, got True"),
    ("batched prompts", COMP, comp(prompt=["a", "b"]), 400, "prompt", None, "batched prompts"),
    ("a 200,000-character prompt (was a 500)", COMP, comp(prompt="a" * 200_000), 400, "prompt",
     "context_length_exceeded", "the prompt is 200000 tokens and this model's context is 4096 tokens"),
    ("a 200,000-character chat (was a 500)", CHAT, chat(messages=[{"role": "user", "content": "a" * 200_000}]), 400,
     "messages", "context_length_exceeded", "this model's context is 4096 tokens"),
    # chat messages
    ("messages missing", CHAT, {"max_tokens": 2}, 400, "messages", None, "messages: Field required"),
    ("messages not a list", CHAT, chat(messages="hi"), 400, "messages", None, "valid list"),
    ("messages empty", CHAT, chat(messages=[]), 400, "messages", None, "messages is empty"),
    ("a message not an object", CHAT, chat(messages=["hi"]), 400, "messages[0]", None, "must be an object"),
    ("no role", CHAT, chat(messages=[{"content": "hi"}]), 400, "messages[0].role", None, "has no 'role'"),
    ("role wizard (the issue's case)", CHAT, chat(messages=[{"role": "wizard", "content": "hi"}]), 400,
     "messages[0].role", None, "messages[0].role is 'wizard'; use one of system, developer, user, assistant, tool"),
    ("role an int", CHAT, chat(messages=[*USER, {"role": 1, "content": "x"}]), 400, "messages[1].role", None,
     "is 1"),
    ("content 5 (the issue's case)", CHAT, chat(messages=[{"role": "user", "content": 5}]), 400,
     "messages[0].content", None, "must be a string or a list of text parts, got int"),
    ("content null on a user turn", CHAT, chat(messages=[{"role": "user", "content": None}]), 400,
     "messages[0].content", None, "required for role 'user'"),
    ("content missing", CHAT, chat(messages=[{"role": "system"}]), 400, "messages[0].content", None, "required"),
    ("an image part", CHAT,
     chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]),
     400, "messages[0].content[0]", "unsupported_content_type", "type 'image_url': this server takes text only"),
    ("a part without type", CHAT, chat(messages=[{"role": "user", "content": [{"text": "hi"}]}]), 400,
     "messages[0].content[0]", "unsupported_content_type", "has type None"),
    ("a text part with a number", CHAT, chat(messages=[{"role": "user", "content": [{"type": "text", "text": 3}]}]),
     400, "messages[0].content[0].text", None, "must be a string, got int"),
    ("a part that is a string", CHAT, chat(messages=[{"role": "user", "content": ["hi"]}]), 400,
     "messages[0].content[0]", None, "must be an object"),
    ("name a number", CHAT, chat(messages=[{"role": "user", "content": "hi", "name": 7}]), 400, "messages[0].name",
     None, "must be a string"),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "code", "needle"), [case[1:] for case in BAD], ids=[case[0] for case in BAD]
)
def test_each_bad_field_is_a_4xx_with_an_openai_error_naming_it(client, path, body, status, param, code, needle):
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert set(r.json()) == {"error"} and set(error) == {"message", "type", "param", "code"}
    assert needle in error["message"]
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code)


@pytest.mark.parametrize("stream", [False, True])
def test_bad_fields_of_a_streamed_request_are_refused_before_the_stream_starts(client, stream):
    r = client.post(CHAT, json=chat(stream=stream, messages=[{"role": "wizard", "content": "hi"}]))
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")


RAW = [
    ("malformed JSON", b'{"prompt": "hi", ', "application/json", "JSON decode error", None),
    ("a JSON array body", b"[1, 2]", "application/json", "valid dictionary", None),
    ("a JSON string body", b'"hi"', "application/json", "valid dictionary", None),
    ("an empty body", b"", "application/json", "Field required", None),
    ("not UTF-8", b'{"prompt": "\xff\xfe"}', "application/json", "send one JSON object, UTF-8 encoded", None),
    ("NaN temperature", b'{"prompt": "hi", "temperature": NaN}', "application/json", "finite number", "temperature"),
    ("Infinity max_tokens", b'{"prompt": "hi", "max_tokens": Infinity}', "application/json", "valid integer", "max_tokens"),
    ("deeply nested JSON", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "application/json",
     "error parsing the body", None),
    ("a form body", b"prompt=hi", "application/x-www-form-urlencoded", "invalid request", None),
]


@pytest.mark.parametrize(("body", "content_type", "needle", "param"), [c[1:] for c in RAW], ids=[c[0] for c in RAW])
def test_bodies_that_are_not_a_request_object_are_400(client, body, content_type, needle, param):
    r = client.post(COMP, content=body, headers={"content-type": content_type})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert needle in error["message"] and error["type"] == "invalid_request_error"
    assert error["param"] == param  # a field, never a JSON syntax error's character offset


def test_wrong_paths_and_methods_answer_in_the_same_error_shape(client):
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["message"] == "Not Found"
    r = client.get(COMP)
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"


ACCEPTED = [
    ("greedy with sampling knobs set (they cannot change the argmax)", COMP,
     comp(temperature=0, top_p=0.5, top_k=40, min_p=0.1)),
    ("neutral values at T>0", COMP,
     comp(temperature=0.8, top_p=1, top_k=-1, min_p=0, presence_penalty=0, frequency_penalty=0.0,
          repetition_penalty=1, logit_bias={}, n=1, best_of=1, echo=False, logprobs=None, seed=3)),
    ("temperature 2", COMP, comp(temperature=2, seed=1)),
    ("fields this server ignores", CHAT, chat(user="u-1", metadata={"k": "v"}, parallel_tool_calls=False)),
    ("text content parts", CHAT, chat(messages=[{"role": "user", "content": [{"type": "text", "text": "h"},
                                                                             {"type": "text", "text": "i"}]}])),
    ("every role; developer; an assistant turn without content", CHAT,
     chat(messages=[{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi", "name": "ann"},
                    {"role": "assistant", "content": None, "tool_calls": []},
                    {"role": "tool", "content": "{}", "tool_call_id": "c1"}, {"role": "user", "content": "ok"}])),
    ("response_format text, chat logprobs false", CHAT, chat(response_format={"type": "text"}, logprobs=False)),
    ("the largest max_tokens the context allows", COMP, comp(prompt=[1] * (CONTEXT - 3), max_tokens=3)),
]


@pytest.mark.parametrize(("path", "body"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_valid_requests_at_the_edges_are_served(client, path, body):
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


def test_content_parts_are_the_same_prompt_as_the_string_and_developer_is_system(client):
    def prompt_tokens(messages):
        return client.post(CHAT, json=chat(messages=messages, temperature=0)).json()["usage"]["prompt_tokens"]

    assert prompt_tokens([{"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}]) \
        == prompt_tokens(USER)
    r1 = client.post(CHAT, json=chat(messages=[{"role": "developer", "content": "x"}, *USER], temperature=0)).json()
    r2 = client.post(CHAT, json=chat(messages=[{"role": "system", "content": "x"}, *USER], temperature=0)).json()
    assert r1["ddtree"] == r2["ddtree"] and r1["usage"] == r2["usage"]


def test_an_unset_max_tokens_fits_what_the_context_leaves(client):
    # 4093 prompt tokens, no max_tokens (default 16): generation fits the 3 positions left.
    body = client.post(COMP, json={"prompt": [1] * (CONTEXT - 3), "temperature": 0}).json()
    assert body["usage"]["prompt_tokens"] == CONTEXT - 3
    assert 1 <= body["usage"]["completion_tokens"] <= 3
    r = client.post(COMP, json={"prompt": [1] * CONTEXT})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert client.get("/v1/models").json()["data"][0]["max_model_len"] == CONTEXT


# ---- random JSON shapes: never a 5xx ---------------------------------------------------------

FIELDS = [
    "prompt", "messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "stop", "stream", "stream_options", "n",
    "logprobs", "top_logprobs", "echo", "best_of", "suffix", "logit_bias", "tools", "response_format", "user",
]


def _random_value(rng: random.Random, depth: int = 0):
    kinds = ["int", "float", "str", "bool", "null", "list", "dict", "message", "big"]
    kind = rng.choice(kinds if depth < 3 else kinds[:5])
    if kind == "int":
        return rng.choice([0, 1, -1, 2, 5, 259, 260, 4095, 4096, 10**20, -(2**63) - 1])
    if kind == "float":
        return rng.choice([0.0, 0.5, 1.0, 1.5, 2.0, 2.5, -0.1, 1e308, -1e-9])
    if kind == "str":
        return rng.choice(["", "hi", "tiny", "user", "text", "\u00e9\u4e2d", "\x00", "a" * rng.randint(0, 5000)])
    if kind == "bool":
        return rng.choice([True, False])
    if kind == "null":
        return None
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "message":
        return {"role": rng.choice(["user", "system", "assistant", "tool", "developer", "bot", 3, None]),
                "content": _random_value(rng, depth + 1)}
    if kind == "big":
        return [rng.randint(-5, 300) for _ in range(rng.randint(0, 50))]
    return {rng.choice(FIELDS + ["type", "text", "include_usage"]): _random_value(rng, depth + 1)
            for _ in range(rng.randint(0, 3))}


def _random_message(rng: random.Random):
    """A chat message with one part of it (role, content, a content part, a key) replaced at random."""
    message = {"role": rng.choice(["user", "system", "assistant", "tool", "developer"]), "content": "hi"}
    spot = rng.choice(["role", "content", "part", "key", "none"])
    if spot == "role":
        message["role"] = _random_value(rng, 2)
    elif spot == "content":
        message["content"] = _random_value(rng, 1)
    elif spot == "part":
        part = rng.choice([{"type": "text", "text": _random_value(rng, 2)}, {"type": _random_value(rng, 2)},
                           _random_value(rng, 2), {"type": "image_url", "image_url": {"url": "x"}}])
        message["content"] = [{"type": "text", "text": "a"}, part]
    elif spot == "key":
        message.pop(rng.choice(["role", "content"]))
        message[rng.choice(["name", "tool_calls", "x"])] = _random_value(rng, 2)
    return message


def _random_body(rng: random.Random):
    roll = rng.random()
    if roll < 0.05:
        return _random_value(rng)  # not even an object
    if roll < 0.6:  # a valid request with one to three things wrong: reaches the checks past the first
        body = {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.3:
                body["messages"] = [_random_message(rng) for _ in range(rng.randint(1, 3))]
            else:
                body[rng.choice(FIELDS)] = _random_value(rng)
        return body
    return {name: _random_value(rng) for name in rng.sample(FIELDS, rng.randint(0, 6))}


def test_random_request_shapes_never_get_a_5xx(client):
    rng = random.Random(14)
    statuses: dict[int, int] = {}
    for i in range(400):
        body = _random_body(rng)
        path = rng.choice([COMP, CHAT])
        r = client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        assert r.status_code < 500, (i, path, body, r.text)
        if r.status_code != 200:
            error = r.json()["error"]
            assert isinstance(error["message"], str) and error["message"], (body, r.text)
        elif r.headers["content-type"].startswith("text/event-stream"):
            assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text, (body, r.text)
    # The generator reaches both outcomes, or it proves nothing about either.
    assert statuses.get(200, 0) >= 20 and sum(v for k, v in statuses.items() if 400 <= k < 500) >= 150, statuses
