"""Request bodies of `/v1/completions` and `/v1/chat/completions`, checked field by field.

Every field this server reads is type-checked (strict: `"5"`, `5.0` and `true` are not the integer
5) and range-checked, and each refusal is an `ApiError` naming the field (`param`), so a client
gets a 4xx with an OpenAI-style body, never a 500. Sampling options the engine does not implement
are accepted only at values that leave sampling unchanged (`top_p: 1`, `presence_penalty: 0`, ...;
`top_p`/`top_k`/`min_p` at any valid value when greedy, where they cannot change the argmax), and
refused otherwise rather than silently ignored. Fields this server neither reads nor refuses
(`user`, `metadata`, ...) are ignored, as vLLM does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from ..types import Engine, SamplingParams, Tokenizer

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_CHAT_MAX_TOKENS = 256
MAX_TEMPERATURE = 2.0  # OpenAI's range is [0, 2]
SEED_RANGE = (-(2**63), 2**64)  # what torch.Generator.manual_seed accepts (upper bound excluded)
# OpenAI chat roles; `developer` is OpenAI's newer name for `system` and is rendered as one.
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")

StrictInt = Annotated[int, Field(strict=True)]
StrictBool = Annotated[bool, Field(strict=True)]
StrictStr = Annotated[str, Field(strict=True)]
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]  # ints pass; NaN, inf, bools do not


class ApiError(Exception):
    """An error answered with an OpenAI-style body and `status`; `headers` go on the response."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout_error",
}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """`{"error": {"message", "type", "param", "code"}}`, the type following OpenAI's for `status`."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if 400 <= status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def bad(message: str, param: str | None, code: str | None = None) -> ApiError:
    """A 400 naming the field (`param`) and, for a known kind of refusal, OpenAI's `code`."""
    return ApiError(400, message, param, code)


class _OpenAIRequest(BaseModel):
    # Clients send many fields this server ignores (user, metadata, ...): allowed, not read.
    model_config = ConfigDict(extra="allow")

    model: StrictStr | None = None
    max_tokens: StrictInt | None = None
    temperature: Number | None = None  # None (or absent) means OpenAI's default, 1.0
    top_p: Number | None = None
    top_k: StrictInt | None = None
    min_p: Number | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    repetition_penalty: Number | None = None
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool | None = False
    stream_options: dict[str, Any] | None = None
    n: StrictInt | None = 1
    logit_bias: dict[str, Any] | None = None


class CompletionRequest(_OpenAIRequest):
    prompt: Any  # checked by `completion_prompt_ids`, where the messages can say what is wrong
    logprobs: StrictInt | None = None
    echo: StrictBool | None = None
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None


class ChatCompletionRequest(_OpenAIRequest):
    messages: list[Any]  # each checked by `chat_messages`
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None


@dataclass
class PreparedRequest:
    prompt_ids: list[int]
    params: SamplingParams
    stop_strings: tuple[str, ...]
    stream: bool
    include_usage: bool


def _in_range(value: float | None, param: str, low: float, high: float, *, open_low: bool = False) -> None:
    if value is None:
        return
    if value < low or (open_low and value == low) or value > high:
        interval = f"{'(' if open_low else '['}{low:g}, {high:g}]"
        raise bad(f"{param} must be in {interval}, got {value}", param)


def _unsupported(param: str, value: Any, why: str) -> ApiError:
    return bad(f"{param}={value!r} is not supported: {why}", param, "unsupported_parameter")


def check_sampling(req: _OpenAIRequest) -> float:
    """Range-check the sampling fields; refuse values the engine would silently ignore.

    Args:
        req: a parsed request (types already checked by pydantic).

    Returns:
        The temperature to sample at (OpenAI's default 1.0 when absent or null).
    """
    temperature = 1.0 if req.temperature is None else req.temperature
    if temperature < 0:  # the historical message, kept for clients that match on it
        raise bad(f"temperature must be >= 0, got {temperature}", "temperature")
    _in_range(temperature, "temperature", 0.0, MAX_TEMPERATURE)
    _in_range(req.top_p, "top_p", 0.0, 1.0, open_low=True)
    _in_range(req.min_p, "min_p", 0.0, 1.0)
    _in_range(req.presence_penalty, "presence_penalty", -2.0, 2.0)
    _in_range(req.frequency_penalty, "frequency_penalty", -2.0, 2.0)
    _in_range(req.repetition_penalty, "repetition_penalty", 0.0, 2.0, open_low=True)
    if req.top_k is not None and req.top_k < -1:
        raise bad(f"top_k must be -1 or 0 (off) or >= 1, got {req.top_k}", "top_k")
    if req.n is not None and req.n < 1:
        raise bad(f"n must be >= 1, got {req.n}", "n")
    if req.n not in (None, 1):
        raise bad(f"n must be 1 (this server runs batch size 1), got {req.n}", "n", "unsupported_parameter")
    if req.seed is not None and not SEED_RANGE[0] <= req.seed < SEED_RANGE[1]:
        raise bad(f"seed must be in [-2**63, 2**64), got {req.seed}", "seed")

    full = "this server samples from the full distribution; omit it"
    if temperature > 0:  # at T=0 these cannot change the argmax, so greedy clients may keep sending them
        if req.top_p is not None and req.top_p < 1:
            raise _unsupported("top_p", req.top_p, f"{full} or send 1")
        if req.top_k is not None and req.top_k >= 1:
            raise _unsupported("top_k", req.top_k, f"{full} or send -1")
        if req.min_p:
            raise _unsupported("min_p", req.min_p, f"{full} or send 0")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name):
            raise _unsupported(name, getattr(req, name), "this server applies no penalties; omit it or send 0")
    if req.repetition_penalty not in (None, 1):
        raise _unsupported("repetition_penalty", req.repetition_penalty, "omit it or send 1")
    if req.logit_bias:
        raise _unsupported("logit_bias", "{...}", "omit it or send {}")
    return float(temperature)


def check_completion_extras(req: CompletionRequest) -> None:
    """Refuse the /v1/completions options this server cannot honour."""
    if req.logprobs is not None:
        raise _unsupported("logprobs", req.logprobs, "this server returns no log-probabilities; omit it")
    if req.echo:
        raise _unsupported("echo", True, "omit it or send false")
    if req.best_of not in (None, 1):
        raise _unsupported("best_of", req.best_of, "this server runs batch size 1; omit it or send 1")
    if req.suffix:
        raise _unsupported("suffix", req.suffix[:20], "omit it")


def check_chat_extras(req: ChatCompletionRequest) -> None:
    """Refuse the /v1/chat/completions options this server cannot honour."""
    if req.logprobs or req.top_logprobs is not None:
        param = "logprobs" if req.logprobs else "top_logprobs"
        raise _unsupported(param, getattr(req, param), "this server returns no log-probabilities; omit it")
    if req.tools:
        raise _unsupported("tools", f"[{len(req.tools)} tools]", "this server does not call tools; omit it")
    kind = (req.response_format or {}).get("type", "text")
    if kind != "text":
        raise _unsupported("response_format", {"type": kind}, "this server produces plain text only")


def completion_prompt_ids(req: CompletionRequest, tokenizer: Tokenizer, vocab_size: int) -> list[int]:
    """The prompt's token ids: a string, a list of token ids, or a one-element list of either."""
    shapes = "send a string, a list of token ids, or a one-element list of either"
    prompt: Any = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise bad(f"batched prompts are not supported (got {len(prompt)}); send one prompt per request", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = list(tokenizer.encode(prompt, add_special_tokens=False)) if prompt else []
    elif isinstance(prompt, list):
        wrong = next((t for t in prompt if type(t) is not int), None)  # bool is an int subclass: refused
        if wrong is not None:
            raise bad(f"prompt token ids must be integers, got {wrong!r}; {shapes}", "prompt")
        ids = list(prompt)
        outside = [t for t in ids if not 0 <= t < vocab_size]
        if outside:
            raise bad(f"prompt token ids must be in [0, {vocab_size}), got {outside[:5]}", "prompt")
    else:
        raise bad(f"prompt must be a string or token ids, got {type(prompt).__name__}; {shapes}", "prompt")
    if not ids:
        raise bad("prompt is empty: send a non-empty string or list of token ids", "prompt")
    return ids


def _message_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"{where} must be a string or a list of text parts, got {type(content).__name__}", where)
    texts = []
    for j, part in enumerate(content):
        here = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise bad(f"{here} must be an object like {{'type': 'text', 'text': '...'}}, got {part!r:.40}", here)
        if part.get("type") != "text":
            raise bad(
                f"{here} has type {part.get('type')!r}: this server takes text only; send 'text' parts",
                here,
                "unsupported_content_type",
            )
        if not isinstance(part.get("text"), str):
            raise bad(f"{here}.text must be a string, got {type(part.get('text')).__name__}", f"{here}.text")
        texts.append(part["text"])
    return "".join(texts)


def chat_messages(raw: list[Any]) -> list[dict[str, str]]:
    """`{"role", "content"}` dicts for the chat template, each message checked.

    Args:
        raw: the request's `messages` as sent.

    Returns:
        one dict per message, content flattened to text, `developer` rendered as `system`.
    """
    if not raw:
        raise bad("messages is empty: send at least one message", "messages")
    messages = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"{where} must be an object with 'role' and 'content', got {type(m).__name__}", where)
        if "role" not in m:
            raise bad(f"{where} has no 'role'", f"{where}.role")
        role = m["role"]
        if role not in CHAT_ROLES:
            raise bad(f"{where}.role is {role!r}; use one of {', '.join(CHAT_ROLES)}", f"{where}.role")
        content = m.get("content")
        if content is None:
            if role != "assistant":  # OpenAI allows a null content only on an assistant's tool-call turn
                raise bad(f"{where}.content is required for role {role!r}", f"{where}.content")
            content = ""
        if "name" in m and not isinstance(m["name"], str):
            raise bad(f"{where}.name must be a string", f"{where}.name")
        text = _message_text(content, f"{where}.content")
        messages.append({"role": "system" if role == "developer" else role, "content": text})
    return messages


def chat_prompt_ids(req: ChatCompletionRequest, engine: Engine) -> list[int]:
    """The chat template's token ids for the request's messages."""
    ids = engine.chat_prompt_ids(chat_messages(req.messages))
    if not ids:
        raise bad("the chat template produced an empty prompt", "messages")
    return ids


def _max_tokens(requested: int | None, default: int, prompt_len: int, context: int | None, prompt_param: str) -> int:
    if requested is not None and requested < 1:
        raise bad(f"max_tokens must be >= 1, got {requested}", "max_tokens")
    if context is None:
        return default if requested is None else requested
    room = context - prompt_len
    if room < 1:
        raise bad(
            f"the prompt is {prompt_len} tokens and this model's context is {context} tokens: "
            "shorten the prompt to leave room for at least one generated token",
            prompt_param,
            "context_length_exceeded",
        )
    if requested is None:
        return min(default, room)  # as vLLM does: an unset limit fits what is left
    if requested > room:
        raise bad(
            f"this model's context is {context} tokens, but {prompt_len + requested} were requested "
            f"({prompt_len} in the prompt, {requested} for the completion): lower max_tokens to at most {room} "
            "or shorten the prompt",
            "max_tokens",
            "context_length_exceeded",
        )
    return requested


def prepare(
    req: _OpenAIRequest,
    prompt_ids: list[int],
    max_tokens: int | None,
    default_max: int,
    tokenizer: Tokenizer,
    context_length: int | None,
    prompt_param: str,
) -> PreparedRequest:
    """Turn a checked request into the engine's arguments.

    Args:
        req: the parsed request; its sampling fields are checked here.
        prompt_ids: the prompt's token ids.
        max_tokens: the requested completion limit (None: `default_max`, cut to the context).
        default_max: the endpoint's default completion limit.
        tokenizer: encodes the stop strings.
        context_length: the model's context in tokens (None: not known, not checked).
        prompt_param: the field named when the prompt is too long (`prompt` or `messages`).

    Returns:
        The prompt ids, sampling params, stop strings and streaming flags.
    """
    temperature = check_sampling(req)
    limit = _max_tokens(max_tokens, default_max, len(prompt_ids), context_length, prompt_param)
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    stop_ids: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        stop_ids.append(int(eos))
    for s in stops:
        if not s:
            raise bad("stop strings must be non-empty", "stop")
        ids = tokenizer.encode(s, add_special_tokens=False)
        if len(ids) == 1:  # stops generation at once; longer stops only cut the text
            stop_ids.append(int(ids[0]))
    include_usage = (req.stream_options or {}).get("include_usage", False)
    if not isinstance(include_usage, bool) and include_usage is not None:
        raise bad("stream_options.include_usage must be true or false", "stream_options.include_usage")
    params = SamplingParams(
        max_new_tokens=limit, temperature=temperature, seed=req.seed, stop_token_ids=tuple(dict.fromkeys(stop_ids))
    )
    return PreparedRequest(prompt_ids, params, tuple(stops), bool(req.stream), bool(include_usage))


def validation_param(loc: tuple) -> str | None:
    """The request field a pydantic error is about: `("body", "stop", "str")` -> `stop`; None for the
    body as a whole, or for a JSON syntax error (`("body", 17)`: a character offset, not a field)."""
    return loc[1] if len(loc) > 1 and isinstance(loc[1], str) else None
