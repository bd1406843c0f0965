"""One host's share of `compare`: the warm-up, the measured runs (arms alternating), and each run's figures.

`run.run_compare` plans the hosts and calls `compare_host` for each; a request that fails is that run's
error, and a host that goes silent for the stall timeout is given up (its remaining runs not attempted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import httpx

from ..config import Host, Service
from ..service.client import ServiceClient, service_url
from ..service.metrics_text import GENERATION_TOKENS, accept_length_delta, counter_delta
from .prompts import Prompt
from .report import decode_tokens_per_s

WARMUP_MAX_TOKENS = 8
ARMS = ("baseline", "tree")
# The longest a measured request may go without a byte from the server (connect, first token, the gap
# between two tokens) before its host counts as not answering. A streaming server sends every token
# as it commits; two minutes of silence is a host that is gone, not a slow prompt.
DEFAULT_STALL_S = 120.0


def failure(host: str | None, service: str | None, message: str) -> dict[str, Any]:
    """One `{host, service, message}` item of the report's `failures` (the JSON envelope's shape)."""
    return {"host": host, "service": service, "message": message}


def failure_line(item: dict[str, Any]) -> str:
    """`host/service: message` (or `host: message`) for stderr and compare.md."""
    where = "/".join(x for x in (item.get("host"), item.get("service")) if x)
    return f"{where}: {item['message']}" if where else item["message"]


@dataclass
class RunResult:
    """One streamed request on one arm."""

    host: str
    prompt: str
    arm: str  # "baseline" | "tree"
    service: str
    run: int  # 0-based index among this arm's runs of this prompt
    ttft_s: float | None = None
    decode_tps: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # from `usage`
    accept_length: float | None = None  # Δ tokens committed by verify steps ÷ Δ verify calls around this run
    accept_source: str | None = None  # metrics_text.SOURCE_*: which counters gave accept_length
    generation_tokens_delta: float | None = None  # Δ sglang:generation_tokens_total
    server_verify_steps: int | None = None  # the server's own per-request count, when it sends one
    server_committed_tokens: int | None = None  # Σ the server's per-step committed counts, when it sends them
    content_chunks: int = 0
    finish_reason: str | None = None
    text: str = ""
    token_ids: list[int] | None = None
    error: str | None = None


def measure_run(
    client: ServiceClient, model: str | None, prompt: Prompt, max_tokens: int, result: RunResult, timeout_s: float
) -> RunResult:
    """Stream one request between two `/metrics` scrapes and fill `result` in."""
    before = client.metrics()
    streamed = client.stream_chat(list(prompt.messages), max_tokens, model=model, timeout_s=timeout_s)
    after = client.metrics()
    result.ttft_s = streamed.ttft_s
    result.e2e_s = streamed.t_end - streamed.t_start
    result.prompt_tokens = streamed.prompt_tokens
    result.completion_tokens = streamed.completion_tokens
    result.decode_tps = decode_tokens_per_s(streamed.completion_tokens, streamed.t_first_content, streamed.t_last_content)
    acceptance = accept_length_delta(before, after)
    result.accept_length, result.accept_source = acceptance.value, acceptance.source
    result.generation_tokens_delta = counter_delta(before, after, GENERATION_TOKENS)
    result.content_chunks = streamed.content_chunks
    steps = streamed.extra.get("verify_steps")
    result.server_verify_steps = steps if isinstance(steps, int) else None
    per_step = streamed.extra.get("accepted_per_step")  # tokens committed by each verify step
    if isinstance(per_step, list) and all(isinstance(n, int) for n in per_step):
        result.server_committed_tokens = sum(per_step)
    result.finish_reason = streamed.finish_reason
    result.text = streamed.text
    result.token_ids = streamed.token_ids
    return result


def stopped_answering(host: Host, svc: Service, err: Exception, stall_s: float | None, where: str, skipped: int = 0) -> str:
    """The failure line for a service that stopped answering mid-compare (a request timed out)."""
    waited = f"nothing for {stall_s:g} s" if stall_s else "no answer within the request's timeout"
    rest = f"; its {skipped} remaining run(s) on {host.name} were not attempted" if skipped else ""
    return (
        f"{where}: {service_url(host, svc)} sent {waited} ({type(err).__name__}: {err}): the host or the service "
        f"stopped answering{rest}; run `ddtree-ops healthcheck --hosts {host.name}`"
    )


def compare_host(
    host: Host,
    arms: dict[str, Service],
    prompts: Sequence[Prompt],
    runs: int,
    max_tokens: int,
    timeout_s: float,
    say: Callable[[str], None],
    report_runs: list[RunResult],
    failures: list[dict[str, Any]],
    warnings: list[str],
    server_info: dict[str, dict[str, Any]],
    backend: str = "reference",
    stall_s: float | None = None,
) -> None:
    clients = {
        arm: ServiceClient(service_url(host, svc), timeout_s=timeout_s, backend=backend, stall_s=stall_s)
        for arm, svc in arms.items()
    }
    try:
        models: dict[str, str | None] = {}
        for arm, svc in arms.items():
            where = f"{host.name}/{svc.name}"
            try:
                server_info[where] = clients[arm].server_info()
                models[arm] = clients[arm].model_id()
                say(f"{where}: warm-up request")
                clients[arm].stream_chat(list(prompts[0].messages), WARMUP_MAX_TOKENS, model=models[arm], timeout_s=timeout_s)
            except httpx.TimeoutException as err:
                failures.append(failure(host.name, svc.name, stopped_answering(host, svc, err, stall_s, "its warm-up")))
                return
            except (httpx.HTTPError, ValueError) as err:
                failures.append(failure(host.name, svc.name, f"warm-up failed ({service_url(host, svc)}): {err}; is the service healthy?"))
                return
        paths = {arm: server_info[f"{host.name}/{svc.name}"].get("model_path") for arm, svc in arms.items()}
        if paths["baseline"] != paths["tree"]:
            warnings.append(
                f"{host.name}: the arms serve different targets ({paths['baseline']!r} vs {paths['tree']!r}): "
                "speed and the lossless check compare different models"
            )
        for prompt in prompts:
            for run in range(runs):
                # Alternate which arm goes first so slow drift (thermals, caches) is shared.
                order = ARMS if run % 2 == 0 else ARMS[::-1]
                for arm in order:
                    svc = arms[arm]
                    result = RunResult(host=host.name, prompt=prompt.name, arm=arm, service=svc.name, run=run)
                    say(f"{host.name}/{svc.name}: {prompt.name} run {run + 1}/{runs}")
                    try:
                        measure_run(clients[arm], models[arm], prompt, max_tokens, result, timeout_s)
                    except httpx.TimeoutException as err:
                        # A host that stops answering (powered off, frozen, cut off) would cost every
                        # later run the same wait: give it up and go on with the other hosts.
                        result.error = f"{type(err).__name__}: {err}"
                        report_runs.append(result)
                        left = len(prompts) * runs * len(arms) - sum(1 for r in report_runs if r.host == host.name)
                        failures.append(failure(host.name, svc.name, stopped_answering(
                            host, svc, err, stall_s, f"prompt {prompt.name!r} run {run}", skipped=left)))
                        return
                    except (httpx.HTTPError, ValueError) as err:
                        result.error = f"{type(err).__name__}: {err}"
                        failures.append(failure(host.name, svc.name, f"prompt {prompt.name!r} run {run}: {result.error}"))
                    else:
                        if (
                            result.generation_tokens_delta is not None
                            and result.generation_tokens_delta != result.completion_tokens
                        ):
                            warnings.append(
                                f"{host.name}/{svc.name}: prompt {prompt.name!r} run {run}: /metrics grew by "
                                f"{result.generation_tokens_delta:g} tokens but usage says {result.completion_tokens}: "
                                "other traffic reached the service, so its acceptance length is unreliable"
                            )
                    report_runs.append(result)
    finally:
        for c in clients.values():
            c.close()
