"""OpenAI-compatible HTTP server over any `types.Engine` (batch size 1).

The engine loads and warms up in a background thread so the port answers `/health` with 503 at
once; generation runs in worker threads behind one lock because the engine is not thread-safe.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client.exposition import choose_encoder
from pydantic import BaseModel, ConfigDict

from ..types import Engine, GenerationResult, SamplingParams, TokenCallback, Tokenizer, missing_engine_members
from .metrics import ServerMetrics, metrics_registry
from .text import CompletionText

logger = logging.getLogger("ddtree_engine.server")

WARMUP_PROMPT = "The quick brown fox"
WARMUP_TOKENS = 4
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_CHAT_MAX_TOKENS = 256


@dataclass
class ServerSettings:
    """What the server needs beyond the engine. `on_load_failure` lets `serve` stop uvicorn."""

    host: str = "127.0.0.1"
    port: int = 30000
    served_model_name: str = "lab"
    api_key: str | None = None
    metrics_log_interval: int = 32
    warmup_delay_s: float = 0.0
    on_load_failure: Callable[[BaseException], None] | None = None


def served_model_name_for(target: str) -> str:
    """The default model id: the target directory's name, or "lab" for the built-in pair."""
    if target == "lab":
        return "lab"
    return os.path.basename(os.path.normpath(target)) or "lab"


class ApiError(Exception):
    """An error answered with an OpenAI-style body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def _error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class ServingRuntime:
    """The engine, its warm-up state, the request lock and the metrics."""

    def __init__(self, engine_or_factory: Engine | Callable[[], Engine], settings: ServerSettings) -> None:
        self.settings = settings
        if isinstance(engine_or_factory, Engine) and not isinstance(engine_or_factory, type):
            self._factory: Callable[[], Engine] = lambda: engine_or_factory
        elif callable(engine_or_factory):  # a loader function, or an engine class
            self._factory = engine_or_factory
        else:
            raise TypeError(
                f"expected an engine or a callable returning one, got {engine_or_factory!r} "
                f"(it lacks {', '.join(missing_engine_members(engine_or_factory))})"
            )
        self.engine: Engine | None = None
        self.info: dict[str, Any] = {}
        self.load_error: str | None = None
        self.load_exception: BaseException | None = None
        self.warm = threading.Event()
        self.metrics = ServerMetrics(budget=0, log_interval=settings.metrics_log_interval)
        self.metrics_registry = metrics_registry(lambda: self.metrics.snapshot(), settings.served_model_name)
        self._lock = threading.Lock()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._load_and_warm, name="ddtree-load", daemon=True)
        thread.start()
        return thread

    def _load_and_warm(self) -> None:
        try:
            started = time.monotonic()
            engine = self._factory()
            if not isinstance(engine, Engine):
                raise TypeError(
                    f"the engine factory returned a {type(engine).__name__}, which is not an Engine: "
                    f"it lacks {', '.join(missing_engine_members(engine))}"
                )
            info = dict(engine.server_info())
            if self.settings.warmup_delay_s > 0:
                time.sleep(self.settings.warmup_delay_s)
            prompt_ids = list(engine.tokenizer.encode(WARMUP_PROMPT, add_special_tokens=False))
            with self._lock:
                engine.generate(prompt_ids, SamplingParams(max_new_tokens=WARMUP_TOKENS, temperature=0.0))
            self.engine, self.info = engine, info
            self.metrics.budget = int(info.get("speculative_ddtree_budget") or 0)
            self.warm.set()
            logger.info("engine warm after %.1fs: %s", time.monotonic() - started, info)
        except BaseException as exc:
            self.load_exception = exc
            self.load_error = f"{type(exc).__name__}: {exc}"
            logger.error("engine failed to load: %s", self.load_error, exc_info=exc)
            if self.settings.on_load_failure is not None:
                self.settings.on_load_failure(exc)

    def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        on_tokens: TokenCallback | None = None,
    ) -> GenerationResult:
        """Run one request (blocking; call from a worker thread) and record its metrics."""
        with self._lock:
            result = self.engine.generate(prompt_ids, params, on_tokens=on_tokens)
        self.metrics.record(result)
        return result


# ---- request bodies -------------------------------------------------------------------------


class _OpenAIRequest(BaseModel):
    # Clients send many fields this server ignores (top_p, logprobs, user, ...).
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None  # None (or absent) means OpenAI's default, 1.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    n: int | None = 1


class CompletionRequest(_OpenAIRequest):
    prompt: str | list[int] | list[str] | list[list[int]]


class ChatCompletionRequest(_OpenAIRequest):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None


@dataclass
class PreparedRequest:
    prompt_ids: list[int]
    params: SamplingParams
    stop_strings: tuple[str, ...]
    stream: bool
    include_usage: bool


def _prompt_ids_for_completion(req: CompletionRequest, tokenizer: Tokenizer, vocab_size: int) -> list[int]:
    prompt: Any = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise ApiError(
                400, f"batched prompts are not supported (got {len(prompt)}); send one prompt per request", "prompt"
            )
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = list(tokenizer.encode(prompt, add_special_tokens=False)) if prompt else []
    else:
        ids = list(prompt)
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ApiError(400, f"prompt token ids must be in [0, {vocab_size}), got {bad[:5]}", "prompt")
    if not ids:
        raise ApiError(400, "prompt is empty: send a non-empty string or list of token ids", "prompt")
    return ids


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return "" if content is None else str(content)


def _prompt_ids_for_chat(req: ChatCompletionRequest, engine: Engine) -> list[int]:
    if not req.messages:
        raise ApiError(400, "messages is empty: send at least one message", "messages")
    messages = []
    for i, m in enumerate(req.messages):
        if "role" not in m:
            raise ApiError(400, f"messages[{i}] has no 'role'", "messages")
        messages.append({"role": m["role"], "content": _message_text(m.get("content"))})
    ids = engine.chat_prompt_ids(messages)
    if not ids:
        raise ApiError(400, "the chat template produced an empty prompt", "messages")
    return ids


def _prepare(
    req: _OpenAIRequest, prompt_ids: list[int], max_tokens: int | None, default_max: int, tokenizer: Tokenizer
) -> PreparedRequest:
    if max_tokens is None:
        max_tokens = default_max
    if max_tokens < 1:
        raise ApiError(400, f"max_tokens must be >= 1, got {max_tokens}", "max_tokens")
    temperature = 1.0 if req.temperature is None else req.temperature
    if temperature < 0:
        raise ApiError(400, f"temperature must be >= 0, got {temperature}", "temperature")
    if req.n not in (None, 1):
        raise ApiError(400, f"n must be 1 (this server runs batch size 1), got {req.n}", "n")
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    stop_ids: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        stop_ids.append(int(eos))
    for s in stops:
        if not s:
            raise ApiError(400, "stop strings must be non-empty", "stop")
        ids = tokenizer.encode(s, add_special_tokens=False)
        if len(ids) == 1:  # stops generation at once; longer stops only cut the text
            stop_ids.append(int(ids[0]))
    params = SamplingParams(
        max_new_tokens=max_tokens,
        temperature=float(temperature),
        seed=req.seed,
        stop_token_ids=tuple(dict.fromkeys(stop_ids)),
    )
    include_usage = bool((req.stream_options or {}).get("include_usage"))
    return PreparedRequest(prompt_ids, params, tuple(stops), bool(req.stream), include_usage)


def _usage(result: GenerationResult) -> dict[str, int]:
    completion = len(result.token_ids)
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": result.prompt_tokens + completion,
    }


def _ddtree_stats(result: GenerationResult) -> dict[str, Any]:
    """Non-standard per-request speculation stats (the compare tool reads them)."""
    return {
        "verify_steps": result.verify_steps,
        "accepted_per_step": result.accepted_per_step,
        "accepted_drafts_per_step": [s.accepted_drafts for s in result.steps],
        "tree_nodes_per_step": [s.tree_nodes for s in result.steps],
        "completion_token_ids": list(result.token_ids),
    }


def _finish_reason(result: GenerationResult, text: CompletionText) -> str:
    return "stop" if text.stopped else result.finish_reason


def _sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


# ---- the app --------------------------------------------------------------------------------


def create_app(engine_or_factory: Engine | Callable[[], Engine], settings: ServerSettings | None = None) -> FastAPI:
    """Build the FastAPI app.

    Args:
        engine_or_factory: a loaded `types.Engine`, or a no-argument callable that loads one; it
            is called in a background thread at startup.
        settings: host/port (reported only), model name, API key, metrics log interval.

    Returns:
        The app; `app.state.runtime` is its ServingRuntime (engine, warm flag, load error, metrics).
    """
    settings = settings or ServerSettings()
    runtime = ServingRuntime(engine_or_factory, settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        runtime.start()
        yield

    app = FastAPI(title="ddtree-engine", lifespan=lifespan)
    app.state.runtime = runtime

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        kinds = {
            400: "invalid_request_error",
            401: "invalid_request_error",
            404: "invalid_request_error",
            503: "service_unavailable",
        }
        return JSONResponse(
            _error_body(exc.message, kinds.get(exc.status, "server_error"), exc.param, exc.code),
            status_code=exc.status,
        )

    @app.exception_handler(Exception)
    async def _unexpected_error(_request: Request, exc: Exception) -> JSONResponse:
        logger.error("request failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
        return JSONResponse(_error_body(f"{type(exc).__name__}: {exc}", "server_error"), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}" for e in exc.errors()
        )
        return JSONResponse(_error_body(f"invalid request: {problems}", "invalid_request_error"), status_code=400)

    def require_ready(request: Request) -> Engine:
        if settings.api_key is not None:
            header = request.headers.get("authorization", "")
            given = header[7:] if header.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(given.encode(), settings.api_key.encode()):
                raise ApiError(
                    401, "invalid or missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key"
                )
        if not runtime.warm.is_set():
            state = f"failed to load: {runtime.load_error}" if runtime.load_error else "warming up"
            raise ApiError(503, f"the model is not ready ({state}); poll /health until it returns 200")
        return runtime.engine

    def require_served_model(model: str | None) -> None:
        # As OpenAI and vLLM answer an unknown model: 404 `model_not_found`. Omitting `model`
        # stays allowed (vLLM serves its one model then; the ids used to be accepted unchecked).
        # The target path (the `root` /v1/models lists) is accepted too: vLLM's default id.
        if model is None:
            return
        known = [settings.served_model_name, runtime.info.get("model_path")]
        if model not in [k for k in known if k]:
            raise ApiError(
                404,
                f"the model {model!r} does not exist: this server serves {settings.served_model_name!r} "
                "(GET /v1/models lists it)",
                "model",
                "model_not_found",
            )

    @app.get("/health")
    async def health() -> JSONResponse:
        if runtime.warm.is_set():
            return JSONResponse({"status": "ok"})
        if runtime.load_error:
            return JSONResponse({"status": "failed", "error": runtime.load_error}, status_code=503)
        return JSONResponse({"status": "warming up"}, status_code=503)

    @app.get("/server_info")
    async def server_info() -> dict[str, Any]:
        return {
            **runtime.info,
            "served_model_name": settings.served_model_name,
            "host": settings.host,
            "port": settings.port,
            "metrics_log_interval": settings.metrics_log_interval,
            "warm": runtime.warm.is_set(),
            "load_error": runtime.load_error,
        }

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        # prometheus_client's own content negotiation, as its ASGI app (which SGLang mounts at
        # /metrics) does: text 0.0.4 unless the scraper asks for OpenMetrics or text 1.0.0, so a
        # Prometheus server stores the same series names for both backends (with OpenMetrics,
        # `sglang_*` samples: prometheus/client_python#1177 escapes ':' in sample names only).
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(runtime.metrics_registry), media_type=content_type)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        require_ready(request)
        return {
            "object": "list",
            "data": [
                {
                    "id": settings.served_model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "ddtree-engine",
                    "root": runtime.info.get("model_path"),
                }
            ],
        }

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        engine = require_ready(request)
        require_served_model(req.model)
        prompt_ids = _prompt_ids_for_completion(req, engine.tokenizer, _vocab_size(engine))
        prepared = _prepare(req, prompt_ids, req.max_tokens, DEFAULT_COMPLETION_MAX_TOKENS, engine.tokenizer)
        return await _respond(runtime, prepared, engine.tokenizer, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        engine = require_ready(request)
        require_served_model(req.model)
        prompt_ids = _prompt_ids_for_chat(req, engine)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        prepared = _prepare(req, prompt_ids, max_tokens, DEFAULT_CHAT_MAX_TOKENS, engine.tokenizer)
        return await _respond(runtime, prepared, engine.tokenizer, "chat")

    return app


def _vocab_size(engine: Engine) -> int:
    return len(engine.tokenizer)


async def _respond(
    runtime: ServingRuntime, prepared: PreparedRequest, tokenizer: Tokenizer, kind: Literal["completion", "chat"]
):
    model = runtime.settings.served_model_name
    request_id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    if prepared.stream:
        return StreamingResponse(
            _stream(runtime, prepared, tokenizer, kind, request_id, created, model),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    text = CompletionText(tokenizer, prepared.stop_strings)

    def stop_at_stop_string(ids: list[int]) -> bool:
        # Stop generating as soon as a stop string is complete, not at max_tokens.
        text.add(ids)
        return text.stopped

    result = await run_in_threadpool(_generate_or_400, runtime, prepared, stop_at_stop_string)
    finish = _finish_reason(result, text)
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text.text}, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text.text, "logprobs": None, "finish_reason": finish}
    return {
        "id": request_id,
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": _usage(result),
        "ddtree": _ddtree_stats(result),
    }


def _generate_or_400(runtime: ServingRuntime, prepared: PreparedRequest, on_tokens=None) -> GenerationResult:
    try:
        return runtime.generate(prepared.prompt_ids, prepared.params, on_tokens)
    except ValueError as exc:  # the engine's own input checks (e.g. prompt longer than the context)
        raise ApiError(400, str(exc)) from exc


async def _stream(
    runtime: ServingRuntime,
    prepared: PreparedRequest,
    tokenizer: Tokenizer,
    kind: Literal["completion", "chat"],
    request_id: str,
    created: int,
    model: str,
) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()

    def post(event: tuple) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, event)
        except RuntimeError:  # the loop is gone: the client went away during shutdown
            pass

    # Set when the client goes away: generation stops at the next verify step instead of
    # holding the engine until max_tokens while later requests queue behind it.
    cancelled = threading.Event()
    stop_detector = CompletionText(tokenizer, prepared.stop_strings)

    def on_tokens(ids: list[int]) -> bool:
        post(("tokens", list(ids)))
        stop_detector.add(ids)
        return stop_detector.stopped or cancelled.is_set()

    def work() -> None:
        try:
            result = _generate_or_400(runtime, prepared, on_tokens)
            post(("done", result))
        except BaseException as exc:  # noqa: BLE001 - reported to the client as an error event
            post(("error", exc))

    threading.Thread(target=work, name="ddtree-generate", daemon=True).start()
    try:
        async for event in _stream_events(events, tokenizer, prepared, kind, request_id, created, model):
            yield event
    finally:
        cancelled.set()


async def _stream_events(
    events: asyncio.Queue,
    tokenizer: Tokenizer,
    prepared: PreparedRequest,
    kind: Literal["completion", "chat"],
    request_id: str,
    created: int,
    model: str,
) -> AsyncIterator[str]:

    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"

    def chunk(delta_text: str | None, finish: str | None, first: bool = False) -> dict:
        if kind == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
            if delta_text:
                delta["content"] = delta_text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta_text or "", "logprobs": None, "finish_reason": finish}
        return {"id": request_id, "object": obj, "created": created, "model": model, "choices": [choice]}

    if kind == "chat":
        yield _sse(chunk(None, None, first=True))
    text = CompletionText(tokenizer, prepared.stop_strings)
    while True:
        event, value = await events.get()
        if event == "tokens":
            delta = text.add(value)
            if delta:
                yield _sse(chunk(delta, None))
        elif event == "error":
            status = value.status if isinstance(value, ApiError) else 500
            message = (
                value.message if isinstance(value, ApiError) else f"generation failed: {type(value).__name__}: {value}"
            )
            yield _sse(
                {
                    "error": {
                        "message": message,
                        "type": "invalid_request_error" if status == 400 else "server_error",
                        "param": None,
                        "code": status,
                    }
                }
            )
            break
        else:
            result: GenerationResult = value
            rest = text.finish()
            if rest:
                yield _sse(chunk(rest, None))
            yield _sse(chunk(None, _finish_reason(result, text)))
            if prepared.include_usage:
                yield _sse(
                    {
                        "id": request_id,
                        "object": obj,
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": _usage(result),
                        "ddtree": _ddtree_stats(result),
                    }
                )
            break
    yield _sse("[DONE]")
