"""The HTTP client of one service: deploy's gate, healthcheck and compare all talk to a server through
`ServiceClient`. Both engine backends answer the same endpoints; where they differ (`/server_info`'s keys,
a generating health check) the project's engine.backend picks the dialect (`dialect.py`)."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import httpx

from ..config import Host, Service
from .api_key import API_KEY_ENV
from .dialect import check_backend, health_generate_path, normalize_info
from .metrics_text import Metrics, MetricsParseError, parse_metrics

def api_headers() -> dict[str, str]:
    """`Authorization` for services started with an API key (read from $DDTREE_API_KEY here too)."""
    key = os.environ.get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def base_url(address: str, port: int) -> str:
    """`http://ADDRESS:PORT`, with IPv6 literals in brackets."""
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"


def service_url(host: Host, service: Service) -> str:
    """Where `service` answers on `host`."""
    return base_url(host.address, service.port)


@dataclass
class StreamedCompletion:
    """One streamed chat completion, timed on arrival of each SSE event."""

    text: str = ""
    token_ids: list[int] | None = None  # when the server sends them (`ddtree` extra field)
    prompt_tokens: int | None = None  # from `usage`
    completion_tokens: int | None = None  # from `usage`, never counted from chunks
    finish_reason: str | None = None
    t_start: float = 0.0
    t_first_content: float | None = None
    t_last_content: float | None = None
    t_end: float = 0.0
    content_chunks: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # the server's `ddtree` stats, if any

    @property
    def ttft_s(self) -> float | None:
        return None if self.t_first_content is None else self.t_first_content - self.t_start


def _sse_events(lines: Iterator[str]) -> Iterator[tuple[float, str]]:
    for line in lines:
        if line.startswith("data:"):
            yield time.perf_counter(), line[5:].strip()


def _token_ids_from(extra: Any) -> list[int] | None:
    # The reference server sends the request's ids in the non-standard `ddtree` field of the
    # usage chunk; SGLang does not, and then the lossless check compares text.
    if isinstance(extra, dict) and isinstance(extra.get("completion_token_ids"), list):
        return [int(t) for t in extra["completion_token_ids"]]
    return None


CONNECT_TIMEOUT_S = 10.0  # a TCP connect on a LAN or loopback takes milliseconds; beyond this the host is gone


def request_timeout(timeout_s: float, stall_s: float | None) -> httpx.Timeout:
    """httpx's timeouts for one request: connect within CONNECT_TIMEOUT_S, each read within `stall_s`.

    Args:
        timeout_s: the request's whole budget (every phase is capped by it).
        stall_s: the longest wait for the next bytes (None = `timeout_s`).
    """
    stall = timeout_s if stall_s is None else min(stall_s, timeout_s)
    return httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s), read=stall)


_TLS_LOCK = threading.Lock()
_TLS: list = []


def _tls_context():
    """httpx's default verifying TLS context, built once per process under a lock: each build reads the
    CA bundle (~20 ms of CPU), which a healthcheck of 8 hosts paid 16 times at once on its threads."""
    with _TLS_LOCK:
        if not _TLS:
            _TLS.append(httpx.create_ssl_context())
        return _TLS[0]


class ServiceClient:
    """The HTTP API of one deployed service; `backend` (the project's engine.backend) picks the dialect
    (`dialect.py`) where the two servers differ."""

    def __init__(self, base_url: str, timeout_s: float = 30.0, backend: str = "reference", stall_s: float | None = None) -> None:
        """Args:
            base_url: the service's URL; backend: the project's engine.backend.
            timeout_s: the longest any one request may take.
            stall_s: the longest the server may send nothing (connect included) before the request
                fails with httpx.TimeoutException: a host that stops answering mid-stream fails
                within it instead of after `timeout_s`; None = `timeout_s`.
        """
        self.base_url = base_url
        self.backend = check_backend(backend)
        self.timeout_s, self.stall_s = timeout_s, stall_s
        self._client = httpx.Client(
            base_url=base_url, timeout=request_timeout(timeout_s, stall_s), headers=api_headers(), verify=_tls_context()
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health_status(self) -> int:
        return self._client.get("/health").status_code

    def generation_health_status(self) -> int | None:
        """The status of the backend's generating health check (`/health_generate`), None where `/health` is one."""
        path = health_generate_path(self.backend)
        return None if path is None else self._client.get(path).status_code

    def server_info(self) -> dict[str, Any]:
        """`/server_info` in the contract's keys, secrets redacted (`dialect.normalize_info`)."""
        r = self._client.get("/server_info")
        r.raise_for_status()
        data = r.json()
        if not isinstance(data, dict):
            raise ValueError(f"/server_info returned {type(data).__name__}, expected a JSON object")
        return normalize_info(self.backend, data)

    def metrics(self) -> Metrics:
        r = self._client.get("/metrics")
        r.raise_for_status()
        try:
            return parse_metrics(r.text)
        except MetricsParseError as err:
            raise ValueError(f"/metrics: {err}") from None

    def model_id(self) -> str | None:
        """The first id `/v1/models` lists (None when the list is empty)."""
        r = self._client.get("/v1/models")
        r.raise_for_status()
        body = r.json()
        if not isinstance(body, dict):
            raise ValueError(f"/v1/models returned {type(body).__name__}, expected a JSON object")
        data = body.get("data") or []
        return data[0].get("id") if data and isinstance(data[0], dict) else None

    def complete(self, prompt: str, max_tokens: int, model: str | None = None) -> dict[str, Any]:
        """A non-streamed greedy `/v1/completions` request; returns the response body."""
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        if model:
            body["model"] = model
        r = self._client.post("/v1/completions", json=body)
        r.raise_for_status()
        return r.json()

    def stream_chat(
        self, messages: list[dict[str, str]], max_tokens: int, model: str | None = None, timeout_s: float = 600.0
    ) -> StreamedCompletion:
        """A streamed greedy chat completion with `usage` requested in the final chunk.

        `timeout_s` bounds the whole request; the client's `stall_s` bounds each wait for the next bytes.

        Raises:
            httpx.HTTPError: the request failed (httpx.TimeoutException: past `timeout_s` in all, or
                `stall_s` without a byte); ValueError: the stream was malformed or had no usage.
        """
        body: dict[str, Any] = {
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if model:
            body["model"] = model
        out = StreamedCompletion()
        pieces: list[str] = []
        out.t_start = time.perf_counter()
        deadline = out.t_start + timeout_s
        with self._client.stream("POST", "/v1/chat/completions", json=body, timeout=request_timeout(timeout_s, self.stall_s)) as r:
            if r.status_code != 200:
                r.read()
                raise httpx.HTTPStatusError(
                    f"/v1/chat/completions answered {r.status_code}: {r.text[:300]}", request=r.request, response=r
                )
            for t, data in _sse_events(r.iter_lines()):
                if t > deadline:
                    raise httpx.ReadTimeout(f"the stream went past the request's {timeout_s:g} s", request=r.request)
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error"):
                    raise ValueError(f"the server reported an error mid-stream: {chunk['error']}")
                usage = chunk.get("usage")
                if usage:
                    out.prompt_tokens = usage.get("prompt_tokens")
                    out.completion_tokens = usage.get("completion_tokens")
                if isinstance(chunk.get("ddtree"), dict):
                    out.extra = chunk["ddtree"]
                    out.token_ids = _token_ids_from(out.extra)
                for choice in chunk.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        if out.t_first_content is None:
                            out.t_first_content = t
                        out.t_last_content = t
                        out.content_chunks += 1
                        pieces.append(content)
                    if choice.get("finish_reason"):
                        out.finish_reason = choice["finish_reason"]
        out.t_end = time.perf_counter()
        out.text = "".join(pieces)
        if out.completion_tokens is None:
            raise ValueError(
                "the stream ended without a `usage` chunk although stream_options.include_usage was set; "
                "token counts are only taken from `usage`, so this server cannot be measured"
            )
        return out
