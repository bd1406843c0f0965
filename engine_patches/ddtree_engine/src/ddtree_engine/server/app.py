"""OpenAI-compatible HTTP server over any `types.Engine` (batch size 1).

The engine loads and warms up in a background thread so the port answers `/health` with 503 at
once. Requests are checked field by field (requests.py) before they queue; admission.py lets one
generate at a time in a worker thread, bounds the queue (429 beyond it), times requests out
(504) and frees the engine when a client goes away.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client.exposition import choose_encoder
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..types import Engine, GenerationResult, SamplingParams, TokenCallback, missing_engine_members
from .admission import Admission, ClientGone
from .metrics import InFlight, LoadCollector, LoadCounters, ServerMetrics, metrics_registry
from .requests import (
    DEFAULT_CHAT_MAX_TOKENS,
    DEFAULT_COMPLETION_MAX_TOKENS,
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    PreparedRequest,
    chat_prompt_ids,
    check_chat_extras,
    check_completion_extras,
    completion_prompt_ids,
    error_body,
    prepare,
    validation_param,
)
from .streaming import JobStreamingResponse, ddtree_stats, finish_reason, stream_events, usage
from .text import CompletionText

logger = logging.getLogger("ddtree_engine.server")

WARMUP_PROMPT = "The quick brown fox"
WARMUP_TOKENS = 4
DEFAULT_MAX_QUEUE = 64  # waiting requests; 48 concurrent clients were measured served (issue 14)
DEFAULT_REQUEST_TIMEOUT_S = 600.0
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a request whose client went away; nobody reads it


@dataclass
class ServerSettings:
    """What the server needs beyond the engine. `on_load_failure` lets `serve` stop uvicorn.

    `max_queue` requests may wait while one generates (more get 429); `request_timeout_s`
    bounds a request from arrival to its last token (None: no bound; past it, 504).
    """

    host: str = "127.0.0.1"
    port: int = 30000
    served_model_name: str = "lab"
    api_key: str | None = field(default=None, repr=False)  # never in a log line that prints the settings
    metrics_log_interval: int = 32
    warmup_delay_s: float = 0.0
    on_load_failure: Callable[[BaseException], None] | None = None
    max_queue: int = DEFAULT_MAX_QUEUE
    request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S


def served_model_name_for(target: str) -> str:
    """The default model id: the target directory's name, or "lab" for the built-in pair."""
    if target == "lab":
        return "lab"
    return os.path.basename(os.path.normpath(target)) or "lab"


class ServingRuntime:
    """The engine, its warm-up state, the admission gate and the metrics."""

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
        self.in_flight = InFlight()
        self.load = LoadCounters(settings.max_queue)
        self.admission = Admission(settings.max_queue, settings.request_timeout_s, self.in_flight, self.load)
        self.metrics_registry = metrics_registry(
            lambda: self.metrics.snapshot(), settings.served_model_name, self.in_flight
        )
        self.metrics_registry.register(LoadCollector(self.load, settings.served_model_name))
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
            self._warm_up(engine.generate, prompt_ids, SamplingParams(max_new_tokens=WARMUP_TOKENS, temperature=0.0))
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

    def _warm_up(self, generate: Callable[..., GenerationResult], *args: Any) -> None:
        # The warm-up shows in the in-flight gauges as running (requests are counted by admission).
        self.in_flight.enqueue()
        self.in_flight.start()
        try:
            with self._lock:
                generate(*args)
        finally:
            self.in_flight.finish(started=True)

    def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        on_tokens: TokenCallback | None = None,
    ) -> GenerationResult:
        """Run one admitted request (blocking; call from a worker thread) and record its metrics.

        Raises:
            ApiError: 400 for the engine's own input checks (a ValueError).
        """
        try:
            with self._lock:
                result = self.engine.generate(prompt_ids, params, on_tokens=on_tokens)
        except ValueError as exc:  # e.g. BadInputError: a request the fields' checks let through
            raise ApiError(400, str(exc)) from exc
        self.metrics.record(result)
        return result


def _context_length(info: dict[str, Any]) -> int | None:
    value = info.get("context_length")
    return value if isinstance(value, int) and value > 0 else None


# ---- the app --------------------------------------------------------------------------------


def create_app(engine_or_factory: Engine | Callable[[], Engine], settings: ServerSettings | None = None) -> FastAPI:
    """Build the FastAPI app.

    Args:
        engine_or_factory: a loaded `types.Engine`, or a no-argument callable that loads one; it
            is called in a background thread at startup.
        settings: host/port (reported only), model name, API key, metrics log interval, queue
            limit and request timeout.

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
        body = error_body(exc.status, exc.message, exc.param, exc.code)
        return JSONResponse(body, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(ClientGone)
    async def _client_gone(_request: Request, _exc: ClientGone) -> Response:
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown paths, wrong methods, bodies FastAPI cannot parse: the same body shape as the rest.
        message = str(exc.detail)
        if exc.status_code == 400:  # FastAPI's "There was an error parsing the body" (not UTF-8, too deep)
            message += ": send one JSON object, UTF-8 encoded, with Content-Type: application/json"
        return JSONResponse(error_body(exc.status_code, message), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected_error(_request: Request, exc: Exception) -> JSONResponse:
        logger.error("request failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
        return JSONResponse(error_body(500, f"{type(exc).__name__}: {exc}"), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}" for e in errors
        )
        param = validation_param(tuple(errors[0].get("loc", ()))) if errors else None
        return JSONResponse(error_body(400, f"invalid request: {problems}", param), status_code=400)

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
            "max_queue": settings.max_queue,
            "request_timeout_s": settings.request_timeout_s,
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
                    "max_model_len": _context_length(runtime.info),
                }
            ],
        }

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        engine = require_ready(request)
        require_served_model(req.model)
        check_completion_extras(req)
        prompt_ids = completion_prompt_ids(req, engine.tokenizer, len(engine.tokenizer))
        prepared = prepare(
            req, prompt_ids, req.max_tokens, DEFAULT_COMPLETION_MAX_TOKENS, engine.tokenizer,
            _context_length(runtime.info), "prompt",
        )
        return await _respond(runtime, request, prepared, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        engine = require_ready(request)
        require_served_model(req.model)
        check_chat_extras(req)
        prompt_ids = chat_prompt_ids(req, engine)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        prepared = prepare(
            req, prompt_ids, max_tokens, DEFAULT_CHAT_MAX_TOKENS, engine.tokenizer,
            _context_length(runtime.info), "messages",
        )
        return await _respond(runtime, request, prepared, "chat")

    return app


async def _respond(
    runtime: ServingRuntime, request: Request, prepared: PreparedRequest, kind: Literal["completion", "chat"]
):
    admission = runtime.admission
    deadline = admission.deadline()
    model = runtime.settings.served_model_name
    request_id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    if prepared.stream:
        return await _stream(runtime, request, prepared, kind, request_id, created, model, deadline)

    text = CompletionText(runtime.engine.tokenizer, prepared.stop_strings)

    def stop_at_stop_string(ids: list[int]) -> bool:
        # Stop generating as soon as a stop string is complete, not at max_tokens.
        text.add(ids)
        return text.stopped

    # Before any byte of the answer: a full queue is a real 429, a queue timeout a real 504.
    # Nothing awaits between acquire and run: the engine slot cannot be lost in between.
    await admission.acquire(deadline, request.is_disconnected)
    job = admission.run(runtime.generate, prepared.prompt_ids, prepared.params, stop_at_stop_string, deadline)
    result = await admission.wait(job, request.is_disconnected)
    finish = finish_reason(result, text)
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
        "usage": usage(result),
        "ddtree": ddtree_stats(result),
    }


async def _stream(
    runtime: ServingRuntime,
    request: Request,
    prepared: PreparedRequest,
    kind: Literal["completion", "chat"],
    request_id: str,
    created: int,
    model: str,
    deadline: float | None,
) -> JobStreamingResponse:
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    tokenizer = runtime.engine.tokenizer

    def post(event: tuple) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, event)
        except RuntimeError:  # the loop is gone: the client went away during shutdown
            pass

    stop_detector = CompletionText(tokenizer, prepared.stop_strings)

    def on_tokens(ids: list[int]) -> bool:
        post(("tokens", list(ids)))
        stop_detector.add(ids)
        return stop_detector.stopped

    def on_done(future) -> None:
        exc = future.exception()
        post(("error", exc) if exc is not None else ("done", future.result()))

    # Queued before the 200 goes out, as for a plain request; nothing awaits between acquire and run.
    await runtime.admission.acquire(deadline, request.is_disconnected)
    job = runtime.admission.run(runtime.generate, prepared.prompt_ids, prepared.params, on_tokens, deadline)
    job.future.add_done_callback(on_done)
    ended: list[bool] = []

    async def body():
        async for event in stream_events(
            events, job, tokenizer, prepared, kind, request_id, created, model, runtime.settings.request_timeout_s
        ):
            yield event
        ended.append(True)

    def on_close() -> None:
        # Finished, timed out, or its client went away: the engine stops at its next verify
        # step either way (a no-op once it has returned), and the metrics say which it was.
        if job.timed_out:
            runtime.load.add("timeouts")
        elif not ended:
            runtime.load.add("disconnects")
        job.stop()

    return JobStreamingResponse(
        body(), on_close, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )
