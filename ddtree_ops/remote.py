"""Read-only queries of a host: systemd and state.json over SSH, and a service's HTTP API.

Nothing here changes a host (changes go through Ansible); these are the quick looks that
`healthcheck` and `compare` need, so a plain `ssh` subprocess and httpx are enough.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import httpx

from .config import Host, Service
from .exceptions import HostError
from .metrics_text import Metrics, MetricsParseError, parse_metrics

STATE_PATH = "/var/lib/ddtree/state.json"
RELEASES_DIR = "/opt/ddtree/releases"
API_KEY_ENV = "DDTREE_API_KEY"


def unit_name(service: str) -> str:
    return f"ddtree-{service}.service"


# ---- SSH ---------------------------------------------------------------------------------------


def ssh_argv(host: Host, remote_command: str, connect_timeout_s: int = 10) -> list[str]:
    """The `ssh` command line for one non-interactive command on `host`."""
    argv = [
        "ssh",
        "-p",
        str(host.ssh.port),
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
        "-o",
        f"ConnectTimeout={connect_timeout_s}",
    ]
    if host.ssh.key:
        argv += ["-i", str(Path(host.ssh.key).expanduser())]
    return argv + [f"{host.ssh.user}@{host.address}", remote_command]


def ssh_exec(
    host: Host,
    remote_command: str,
    *,
    timeout_s: float,
    what: str = "ssh",
    input_text: str | None = None,
    connect_timeout_s: int = 10,
) -> subprocess.CompletedProcess:
    """Run `remote_command` on `host`; the caller judges the exit status.

    Raises:
        HostError: no answer within `timeout_s` (naming `what`), no ssh client here, or the host
            is unreachable (ssh's own exit status 255).
    """
    argv = ssh_argv(host, remote_command, connect_timeout_s=connect_timeout_s)
    try:
        proc = subprocess.run(argv, input=input_text, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise HostError(f"host {host.name} ({host.address}): {what} did not finish within {timeout_s:.0f}s") from None
    except FileNotFoundError:
        raise HostError("the `ssh` client is not installed on this machine: install openssh-client") from None
    if proc.returncode == 255:
        raise HostError(
            f"host {host.name} ({host.ssh.user}@{host.address}:{host.ssh.port}) is unreachable over SSH: "
            f"{proc.stderr.strip() or 'no message'}"
        )
    return proc


def ssh_run(host: Host, remote_command: str, timeout_s: float = 30.0) -> str:
    """Run a read-only command on `host` and return its stdout.

    Raises:
        HostError: the host did not answer, or the command failed (with its stderr).
    """
    proc = ssh_exec(host, remote_command, timeout_s=timeout_s)
    if proc.returncode != 0:
        raise HostError(
            f"host {host.name}: `{remote_command}` exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc.stdout


@dataclass(frozen=True)
class UnitState:
    """What `systemctl show` says about one unit."""

    unit: str
    load_state: str  # loaded | not-found | masked ...
    active_state: str  # active | activating | inactive | failed ...
    sub_state: str  # running | auto-restart | dead ...
    restarts: int | None  # NRestarts: automatic restarts since the unit was last started by hand
    main_pid: int | None

    @property
    def running(self) -> bool:
        return self.active_state == "active" and self.sub_state == "running"

    def describe(self) -> str:
        if self.load_state not in ("loaded", ""):
            return f"{self.load_state} ({self.active_state})"
        return f"{self.active_state}/{self.sub_state}"


_UNIT_MARK = "### unit "
_STATE_MARK = "### state.json"
_SHOW_PROPS = "Id,LoadState,ActiveState,SubState,NRestarts,MainPID"


def host_query_command(services: list[str]) -> str:
    """One remote shell command that prints every unit's state and then state.json.

    One SSH connection per host instead of one per service; markers separate the parts.
    """
    parts = []
    for svc in services:
        unit = shlex.quote(unit_name(svc))
        parts.append(f"echo {shlex.quote(_UNIT_MARK + unit_name(svc))}; systemctl show -p {_SHOW_PROPS} {unit}")
    parts.append(f"echo {shlex.quote(_STATE_MARK)}; cat {STATE_PATH} 2>/dev/null || true")
    return "; ".join(parts)


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "", "[not set]") else None
    except ValueError:
        return None


def parse_systemctl_show(unit: str, text: str) -> UnitState:
    """Parse `systemctl show -p …` output (KEY=VALUE lines)."""
    props: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    main_pid = _int_or_none(props.get("MainPID"))
    return UnitState(
        unit=unit,
        load_state=props.get("LoadState", ""),
        active_state=props.get("ActiveState", "unknown"),
        sub_state=props.get("SubState", "unknown"),
        restarts=_int_or_none(props.get("NRestarts")),
        main_pid=main_pid or None,
    )


@dataclass(frozen=True)
class HostFacts:
    units: dict[str, UnitState]  # by service name
    state: dict[str, Any] | None  # state.json, None when absent
    state_error: str | None = None  # state.json present but unreadable
    releases: dict[str, dict[str, Any]] = field(default_factory=dict)  # service -> its current release.json


def _split_sections(text: str, *, state_mark: bool) -> dict[str, list[str]]:
    """Lines after each `_UNIT_MARK name` marker (and, with `state_mark`, after `_STATE_MARK`), by name."""
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith(_UNIT_MARK):
            current = line[len(_UNIT_MARK) :].strip()
            sections[current] = []
        elif state_mark and line.strip() == _STATE_MARK:
            current = _STATE_MARK
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return sections


def parse_host_query(services: list[str], text: str) -> HostFacts:
    """Split the output of `host_query_command` back into unit states and state.json."""
    sections = _split_sections(text, state_mark=True)
    units = {
        svc: parse_systemctl_show(unit_name(svc), "\n".join(sections.get(unit_name(svc), []))) for svc in services
    }
    raw_state = "\n".join(sections.get(_STATE_MARK, [])).strip()
    state, error = None, None
    if raw_state:
        try:
            state = json.loads(raw_state)
        except json.JSONDecodeError as err:
            error = f"{STATE_PATH} is not valid JSON: {err}"
    return HostFacts(units=units, state=state, state_error=error)


def current_releases(state: dict[str, Any] | None, services: list[str]) -> dict[str, str]:
    """service -> the release id state.json names as current (deploy writes `{"current": id, …}`)."""
    out: dict[str, str] = {}
    entries = (state or {}).get("services") if isinstance(state, dict) else None
    for svc in services:
        entry = (entries or {}).get(svc) if isinstance(entries, dict) else None
        if isinstance(entry, dict) and isinstance(entry.get("current"), str) and entry["current"]:
            out[svc] = entry["current"]
    return out


def release_query_command(releases: dict[str, str]) -> str:
    """Print each current release's release.json after a marker line naming its service."""
    return "; ".join(
        f"echo {shlex.quote(_UNIT_MARK + svc)}; cat {shlex.quote(f'{RELEASES_DIR}/{rid}/release.json')} 2>/dev/null || true"
        for svc, rid in releases.items()
    )


def parse_release_query(text: str) -> dict[str, dict[str, Any]]:
    """The output of `release_query_command` as service -> release.json (unreadable ones left out)."""
    sections = _split_sections(text, state_mark=False)
    out: dict[str, dict[str, Any]] = {}
    for svc, lines in sections.items():
        try:
            data = json.loads("\n".join(lines))
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict):
            out[svc] = data
    return out


def query_host(host: Host, services: list[str], timeout_s: float = 30.0) -> HostFacts:
    """Unit states of `services` on `host`, its state.json and the current releases' release.json.

    Two SSH round trips: the release ids are only known once state.json has been read.
    """
    facts = parse_host_query(services, ssh_run(host, host_query_command(services), timeout_s))
    releases = current_releases(facts.state, services)
    if not releases:
        return facts
    found = parse_release_query(ssh_run(host, release_query_command(releases), timeout_s))
    return HostFacts(units=facts.units, state=facts.state, state_error=facts.state_error, releases=found)


# ---- HTTP --------------------------------------------------------------------------------------


def api_headers() -> dict[str, str]:
    """`Authorization` for services started with an API key (read from $DDTREE_API_KEY here too)."""
    key = os.environ.get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def service_url(host: Host, service: Service) -> str:
    address = f"[{host.address}]" if ":" in host.address else host.address  # IPv6 literals
    return f"http://{address}:{service.port}"


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


class ServiceClient:
    """The HTTP API of one deployed service (both engine backends answer the same way)."""

    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        self.base_url = base_url
        self._client = httpx.Client(base_url=base_url, timeout=timeout_s, headers=api_headers())

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health_status(self) -> int:
        return self._client.get("/health").status_code

    def server_info(self) -> dict[str, Any]:
        r = self._client.get("/server_info")
        r.raise_for_status()
        data = r.json()
        if not isinstance(data, dict):
            raise ValueError(f"/server_info returned {type(data).__name__}, expected a JSON object")
        return data

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

        Raises:
            httpx.HTTPError: the request failed; ValueError: the stream was malformed or had no usage.
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
        with self._client.stream("POST", "/v1/chat/completions", json=body, timeout=timeout_s) as r:
            if r.status_code != 200:
                r.read()
                raise httpx.HTTPStatusError(
                    f"/v1/chat/completions answered {r.status_code}: {r.text[:300]}", request=r.request, response=r
                )
            for t, data in _sse_events(r.iter_lines()):
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
