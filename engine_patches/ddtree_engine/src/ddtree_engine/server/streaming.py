"""Server-sent events of a streamed completion, and the response that frees the engine when its
client goes away."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..types import GenerationResult, Tokenizer
from .admission import Job, timeout_error
from .requests import ApiError, PreparedRequest, error_body
from .text import CompletionText


def sse(payload: dict | str) -> str:
    """One server-sent event: `data: <compact JSON or the string>` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


def usage(result: GenerationResult) -> dict[str, int]:
    """OpenAI's `usage` object of a finished generation."""
    completion = len(result.token_ids)
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": result.prompt_tokens + completion,
    }


def ddtree_stats(result: GenerationResult) -> dict[str, Any]:
    """Non-standard per-request speculation stats (the compare tool reads them)."""
    return {
        "verify_steps": result.verify_steps,
        "accepted_per_step": result.accepted_per_step,
        "accepted_drafts_per_step": [s.accepted_drafts for s in result.steps],
        "tree_nodes_per_step": [s.tree_nodes for s in result.steps],
        "completion_token_ids": list(result.token_ids),
    }


def finish_reason(result: GenerationResult, text: CompletionText) -> str:
    """"stop" when a stop string ended the text, else the engine's own reason."""
    return "stop" if text.stopped else result.finish_reason


def error_event(exc: BaseException) -> str:
    """The SSE event of a failure after the 200 went out: the body the status would have carried."""
    if isinstance(exc, ApiError):
        return sse(error_body(exc.status, exc.message, exc.param, exc.code))
    return sse(error_body(500, f"generation failed: {type(exc).__name__}: {exc}"))


class JobStreamingResponse(StreamingResponse):
    """A StreamingResponse that runs `on_close` however it ends: finished, failed, or cut off by
    a client that went away (Starlette then cancels the stream without closing the generator, so
    a `finally` in the generator alone would not run in time)."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def stream_events(
    events: asyncio.Queue,
    job: Job,
    tokenizer: Tokenizer,
    prepared: PreparedRequest,
    kind: Literal["completion", "chat"],
    request_id: str,
    created: int,
    model: str,
    timeout_s: float | None,
) -> AsyncIterator[str]:
    """The SSE events of one streamed request: chunks as the engine commits tokens, then the
    finish chunk (and `usage` when asked), or an error event; always `[DONE]` last.

    Args:
        events: `("tokens", ids)`, `("done", result)` or `("error", exc)` tuples the job posts.
        job: the running request (its deadline bounds the wait for each event).
        tokenizer, prepared: decode the ids and apply the stop strings.
        kind, request_id, created, model: the fields every chunk carries.
        timeout_s: the server's request timeout, named in the timeout error.
    """
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
        yield sse(chunk(None, None, first=True))
    text = CompletionText(tokenizer, prepared.stop_strings)
    while True:
        try:
            remaining = None if job.deadline is None else max(0.0, job.deadline - time.monotonic())
            event, value = await asyncio.wait_for(events.get(), remaining)
        except asyncio.TimeoutError:  # the engine is stuck in one long step past the deadline
            job.stop(timed_out=True)
            event, value = "done", None
        if event == "tokens":
            delta = text.add(value)
            if delta:
                yield sse(chunk(delta, None))
        elif event == "error":
            yield error_event(value)
            break
        elif job.timed_out:
            yield error_event(timeout_error(timeout_s or 0, "generating"))
            break
        else:
            result: GenerationResult = value
            rest = text.finish()
            if rest:
                yield sse(chunk(rest, None))
            yield sse(chunk(None, finish_reason(result, text)))
            if prepared.include_usage:
                yield sse(
                    {
                        "id": request_id,
                        "object": obj,
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": usage(result),
                        "ddtree": ddtree_stats(result),
                    }
                )
            break
    yield sse("[DONE]")
