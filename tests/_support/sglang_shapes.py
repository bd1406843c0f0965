"""A loopback HTTP server that answers in stock SGLang 0.5.23's shapes, for testing ddtree-ops' sglang dialect.

No real SGLang can serve on a CPU-only machine, so this serves bodies copied from the shapes in SGLang's
own source (paths under sglang/ of the 0.5.23 wheel; line numbers of that release):

- `GET /health`, `GET /health_generate`: srt/entrypoints/http_server.py:721-798 — an empty body, 503 while
  the server is Starting, 200 after; /health_generate runs a one-token generation.
- `GET /server_info` (and its deprecated alias `/get_server_info`, http_server.py:853-892):
  `build_server_info` (srt/utils/common.py:3584) = `ServerArgs.resolved_dict()` + `launch_command` (the argv
  " "-joined, srt/sampling/watermarking/core.py:110-134, only watermark flags redacted) + scheduler info +
  `internal_states`, `version`, `frontend`. Fields as srt/arg_groups/fields/{model,spec,serving,schedule}.py
  name them; `api_key` is a field, so it is in the body in plain text.
- `GET /metrics`: prometheus_client text from srt/observability/metrics_collector.py — counters
  `sglang:prompt_tokens_total`, `sglang:generation_tokens_total` (labels model_name, is_streaming; :1855-1863),
  `sglang:spec_verify_calls_total` (:1865), `sglang:num_requests_total` (:1940), gauges
  `sglang:num_running_reqs` (:364; per-priority series besides the total, :1417-1429) and
  `sglang:spec_accept_length` (:511). Multiprocess mode: no `_created` samples.
- `GET /v1/models`: http_server.py:1993 with ModelCard (srt/entrypoints/openai/protocol.py:87).
- `POST /v1/completions`: CompletionResponse (protocol.py:506-542), UsageInfo (protocol.py:221).
- `POST /v1/chat/completions` streamed: ChatCompletionStreamResponse chunks (protocol.py:1369-1402), the role
  chunk first (serving_chat.py:2591), then content, then the usage chunk with `choices: []`
  (serving_chat.py:2767-2797) and `data: [DONE]`.
- Auth: with an API key every path needs `Authorization: Bearer KEY` except /health*, /ready*, /metrics*
  (srt/utils/auth.py:93-104).

The "model" emits `word0 word1 …` (the same for every algorithm, as a lossless engine must) and counts
verify steps as if each step committed `accept` tokens after the prefill's first one.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

VERSION = "0.5.23"


@dataclass
class FakeSGLang:
    """What one fake server reports; change the fields to make it misbehave."""

    model_path: str
    algorithm: str | None  # "DDTREE" | "DFLASH" | None (no speculative decoding)
    draft_path: str | None = None
    block_size: int = 16
    budget: int | None = None
    topk: int | None = None
    accept: int = 1  # tokens committed per verify step
    api_key: str | None = None
    port: int = 30000
    starting_polls: int = 0  # /health answers 503 this many times first
    health_generate_status: int = 200
    budget_at_top_level: bool = False  # report the plugin's keys as fields, not only in launch_command
    counters: dict[str, float] = field(default_factory=lambda: {"prompt": 0, "generation": 0, "requests": 0, "verify": 0})
    seen_auth: list[str | None] = field(default_factory=list)

    def argv(self) -> list[str]:
        argv = ["--model-path", self.model_path]
        if self.algorithm:
            argv += ["--speculative-algorithm", self.algorithm, "--speculative-draft-model-path", str(self.draft_path)]
        if self.algorithm == "DDTREE":
            argv += ["--speculative-ddtree-budget", str(self.budget), "--speculative-ddtree-topk", str(self.topk),
                     "--speculative-ddtree-spine-depth", "0", "--speculative-ddtree-hybrid-mode", "safe"]  # fmt: skip
        argv += ["--disable-overlap-schedule", "--attention-backend", "triton", "--page-size", "1", "--enable-metrics",
                 "--host", "0.0.0.0", "--port", str(self.port)]  # fmt: skip
        # The launcher inserts the key at argv[1:1] (ddtree_ops/deploy/sglang_command.py).
        return (["--api-key", self.api_key] if self.api_key else []) + argv

    def verify_tokens(self) -> int | None:
        if self.algorithm == "DDTREE":
            return max(self.block_size, (self.budget or 0) + 1)  # what the plugin sets
        return self.block_size if self.algorithm == "DFLASH" else None

    def server_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            # ServerArgs.resolved_dict(): a few of its ~400 fields, the ones the tools read or must not leak.
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "served_model_name": self.model_path,
            "host": "0.0.0.0",
            "port": self.port,
            "api_key": self.api_key,
            "admin_api_key": None,
            "speculative_algorithm": self.algorithm,
            "speculative_draft_model_path": self.draft_path,
            "speculative_num_steps": None,
            "speculative_eagle_topk": self.topk if self.algorithm == "DDTREE" else (1 if self.algorithm else None),
            "speculative_num_draft_tokens": self.verify_tokens(),
            "speculative_dflash_block_size": None,
            "attention_backend": "triton",
            "page_size": 1,
            "disable_overlap_schedule": True,
            "enable_metrics": True,
            "enable_dp_attention": False,
            "launch_command": " ".join(self.argv()),
            # scheduler_info
            "status": "ready",
            "max_total_num_tokens": 65536,
            "max_req_input_len": 32767,
            "kv_events": None,
            "startup_time": 1764547200.0,
            "internal_states": [{"avg_spec_accept_length": float(self.accept), "last_gen_throughput": 0.0}],
            "version": VERSION,
            "frontend": "python",
        }
        if self.budget_at_top_level and self.algorithm == "DDTREE":
            info.update(speculative_ddtree_budget=self.budget, speculative_ddtree_topk=self.topk)
        return info

    def metrics_text(self) -> str:
        c = self.counters
        labels = f'model_name="{self.model_path}"'
        accept = float(self.accept) if self.algorithm else 0.0
        return (
            "# HELP sglang:num_running_reqs The number of running requests.\n"
            "# TYPE sglang:num_running_reqs gauge\n"
            f'sglang:num_running_reqs{{{labels},priority=""}} 0.0\n'
            f'sglang:num_running_reqs{{{labels},priority="0"}} 0.0\n'
            "# HELP sglang:spec_accept_length Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).\n"
            "# TYPE sglang:spec_accept_length gauge\n"
            f"sglang:spec_accept_length{{{labels}}} {accept}\n"
            "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.\n"
            "# TYPE sglang:prompt_tokens_total counter\n"
            f'sglang:prompt_tokens_total{{is_streaming="false",{labels}}} {c["prompt"]}\n'
            "# HELP sglang:generation_tokens_total Number of generation tokens processed.\n"
            "# TYPE sglang:generation_tokens_total counter\n"
            f'sglang:generation_tokens_total{{is_streaming="false",{labels}}} {c["generation"]}\n'
            "# HELP sglang:spec_verify_calls_total Number of speculative decoding verification calls.\n"
            "# TYPE sglang:spec_verify_calls_total counter\n"
            f"sglang:spec_verify_calls_total{{{labels}}} {c['verify']}\n"
            "# HELP sglang:num_requests_total Number of requests processed.\n"
            "# TYPE sglang:num_requests_total counter\n"
            f'sglang:num_requests_total{{is_streaming="false",{labels}}} {c["requests"]}\n'
        )

    def generate(self, max_tokens: int, prompt_tokens: int) -> list[str]:
        words = [f" word{i}" for i in range(max_tokens)]
        self.counters["prompt"] += prompt_tokens
        self.counters["generation"] += len(words)
        self.counters["requests"] += 1
        if self.algorithm:
            # SGLang counts verify calls per request at its finish (metrics_collector.py:2111).
            self.counters["verify"] += math.ceil((len(words) - 1) / self.accept)
        return words


def _handler(fake: FakeSGLang):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep pytest's output clean
            pass

        def _send(self, status: int, body: Any = None, content_type: str = "application/json") -> None:
            data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            fake.seen_auth.append(self.headers.get("Authorization"))
            if not fake.api_key or self.path.startswith(("/health", "/ready", "/metrics")):
                return True
            if self.headers.get("Authorization") == f"Bearer {fake.api_key}":
                return True
            self._send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path == "/health":
                if fake.starting_polls > 0:
                    fake.starting_polls -= 1
                    return self._send(503)
                return self._send(200)
            if self.path == "/health_generate":
                return self._send(fake.health_generate_status)
            if self.path in ("/server_info", "/get_server_info"):
                return self._send(200, fake.server_info())
            if self.path == "/metrics":
                return self._send(200, fake.metrics_text().encode(), "text/plain; version=0.0.4; charset=utf-8")
            if self.path == "/v1/models":
                card = {"id": fake.model_path, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                        "root": fake.model_path, "parent": None, "max_model_len": 32768}  # fmt: skip
                return self._send(200, {"object": "list", "data": [card]})
            self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            created = int(time.time())
            if self.path == "/v1/completions":
                words = fake.generate(int(body.get("max_tokens", 16)), prompt_tokens=5)
                usage = {"prompt_tokens": 5, "total_tokens": 5 + len(words), "completion_tokens": len(words),
                         "prompt_tokens_details": None, "reasoning_tokens": 0}  # fmt: skip
                choice = {"index": 0, "text": "".join(words), "logprobs": None, "finish_reason": "length", "matched_stop": None}
                return self._send(200, {"id": "cmpl-1", "object": "text_completion", "created": created,
                                        "model": body.get("model") or fake.model_path, "choices": [choice],
                                        "usage": usage, "metadata": None})  # fmt: skip
            if self.path == "/v1/chat/completions" and body.get("stream"):
                prompt_tokens = 3 + sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
                words = fake.generate(int(body.get("max_tokens", 16)), prompt_tokens=prompt_tokens)
                model = body.get("model") or fake.model_path

                def chunk(choices: list, usage: dict | None = None) -> bytes:
                    doc = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": created, "model": model,
                           "choices": choices, "usage": usage}  # fmt: skip
                    return f"data: {json.dumps(doc)}\n\n".encode()

                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                delta = {"role": "assistant", "content": "", "reasoning_content": None}
                self.wfile.write(chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, "matched_stop": None}]))
                for i, word in enumerate(words):
                    last = i == len(words) - 1
                    delta = {"role": None, "content": word, "reasoning_content": None}
                    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": "length" if last else None,
                              "matched_stop": None}  # fmt: skip
                    self.wfile.write(chunk([choice]))
                if (body.get("stream_options") or {}).get("include_usage"):
                    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + len(words),
                             "completion_tokens": len(words), "prompt_tokens_details": None, "reasoning_tokens": 0}  # fmt: skip
                    self.wfile.write(chunk([], usage))
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True
                return
            self._send(404, {"detail": "Not Found"})

    return Handler


class Served:
    """A FakeSGLang listening on `address` (127.0.0.1; any 127.x.y.z is loopback) in a thread (a context manager).

    `port` 0 picks a free one; a second host on another 127.x address can take the first one's port.
    """

    def __init__(self, fake: FakeSGLang, address: str = "127.0.0.1", port: int = 0) -> None:
        self.fake = fake
        self.server = ThreadingHTTPServer((address, port), _handler(fake))
        self.port = self.server.server_address[1]
        fake.port = self.port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
