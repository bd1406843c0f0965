"""Read-only queries of a host over SSH: systemd units, state.json and the current releases' release.json.

Nothing here changes a host (changes go through Ansible); these are the quick looks `healthcheck`
needs. One SSH round trip per host (markers separate the parts), through a `Transport`.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable

from ..config import Host
from .layout import STATE_PATH, current_releases, release_json, unit_name
from .ssh import SSH, Transport


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
class HostState:
    """What `query_host` read off one host: unit states, state.json, the current releases."""

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


def parse_host_query(services: list[str], text: str) -> HostState:
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
    return HostState(units=units, state=state, state_error=error)


def release_query_command(releases: dict[str, str]) -> str:
    """Print each current release's release.json after a marker line naming its service."""
    return "; ".join(
        f"echo {shlex.quote(_UNIT_MARK + svc)}; cat {shlex.quote(release_json(rid))} 2>/dev/null || true"
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


FOLLOW_UP_MARK = "### follow-up"


def query_host(host: Host, services: list[str], timeout_s: float = 30.0, transport: Transport = SSH) -> HostState:
    """Unit states of `services` on `host`, its state.json and the current releases' release.json.

    Two SSH round trips: the release ids are only known once state.json has been read.
    """
    return query_host_with(host, services, lambda _facts: None, timeout_s, transport)[0]


def query_host_with(
    host: Host,
    services: list[str],
    follow_up: Callable[[HostState], str | None],
    timeout_s: float = 30.0,
    transport: Transport = SSH,
) -> tuple[HostState, str | None]:
    """`query_host`, plus one more read-only command chosen from what state.json says, in the same second round trip.

    Args:
        follow_up: the first round trip's facts -> a shell command to run on the host (None: none).
    Returns:
        the host's state, and the follow-up's stdout (None when there was no follow-up).
    """
    facts = parse_host_query(services, transport.run(host, host_query_command(services), timeout_s))
    releases = current_releases(facts.state, services)
    extra = follow_up(facts)
    parts = [release_query_command(releases)] if releases else []
    if extra is not None:
        parts.append(f"echo {shlex.quote(FOLLOW_UP_MARK)}; {{ {extra}; }}")
    if not parts:
        return facts, None
    text = transport.run(host, "; ".join(parts), timeout_s)
    release_text, _, extra_text = text.partition(FOLLOW_UP_MARK + "\n")
    if releases:
        facts = HostState(units=facts.units, state=facts.state, state_error=facts.state_error, releases=parse_release_query(release_text))
    return facts, (extra_text if extra is not None else None)
