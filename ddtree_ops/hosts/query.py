"""Read-only queries of a host over SSH: systemd units, state.json and the current releases' release.json.

Nothing here changes a host (changes go through Ansible); these are the quick looks `healthcheck`
needs. One SSH round trip per host (markers separate the parts), through a `Transport`: the units and
state.json by shell, then `host_scripts/current_release.py` (a bare python3, fed on stdin) follows
state.json's pointers to the current releases' release.json and the env's stored manifest. A login is
the dearest part of the query (~80 ms of sshd CPU, ~0.4 s of wall on a loaded lab host), so one, not two.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..config import Host
from ..exceptions import HostError
from .layout import MANIFEST_NAME, RELEASES_DIR, STATE_PATH, unit_name
from .ssh import SSH, Transport

RELEASE_SCRIPT = Path(__file__).resolve().parent.parent / "host_scripts" / "current_release.py"


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


def host_query_command(services: list[str], env_key: str | None = None) -> str:
    """One remote shell command that prints every unit's state, state.json, then what state.json points at.

    One SSH connection per host instead of one per service or per step; markers separate the parts. The
    last part is `RELEASE_SCRIPT` run by `python3 -` (its text goes on stdin): the current releases'
    release.json and, with `env_key` (`env` or `image`, layout.state_key), the env's stored manifest.
    """
    parts = []
    for svc in services:
        unit = shlex.quote(unit_name(svc))
        parts.append(f"echo {shlex.quote(_UNIT_MARK + unit_name(svc))}; systemctl show -p {_SHOW_PROPS} {unit}")
    parts.append(f"echo {shlex.quote(_STATE_MARK)}; cat {STATE_PATH} 2>/dev/null || true")
    args = [STATE_PATH, RELEASES_DIR, env_key or "-", MANIFEST_NAME, *services]
    # -I: isolated (no user site, no PYTHON* variables, not the login directory first on sys.path).
    parts.append("python3 -I - " + " ".join(shlex.quote(a) for a in args))
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


def parse_release_query(text: str) -> dict[str, dict[str, Any]]:
    """The releases part of `host_query_command`'s output as service -> release.json (unreadable ones left out)."""
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
_RELEASES_MARK = "### releases"


def query_host(
    host: Host,
    services: list[str],
    *,
    env_key: str | None = None,
    timeout_s: float = 30.0,
    transport: Transport = SSH,
) -> tuple[HostState, str | None]:
    """Unit states of `services` on `host`, its state.json, the current releases' release.json, in one round trip.

    Args:
        env_key: also read the ABI manifest stored beside the env (`env`) or image record (`image`)
            that state.json names under this key.
    Returns:
        the host's state, and the stored manifest's text ("" when state.json names no env or the env has
        none; None without `env_key`).
    Raises:
        HostError: the host is unreachable, has no python3, or the query failed.
    """
    proc = transport.exec(
        host, host_query_command(services, env_key), timeout_s=timeout_s, what="the service query",
        input_text=RELEASE_SCRIPT.read_text(),
    )  # fmt: skip
    head, mark, tail = proc.stdout.partition(_RELEASES_MARK + "\n")
    if proc.returncode == 127 and not mark:
        raise HostError(f"host {host.name}: python3 is not installed there; install python3 (>= 3.8), as Ansible needs too")
    if proc.returncode != 0 or not mark:
        raise HostError(
            f"host {host.name}: the service query exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()[-500:]}"
        )
    release_text, _, manifest_text = tail.partition(FOLLOW_UP_MARK + "\n")
    facts = replace(parse_host_query(services, head), releases=parse_release_query(release_text))
    if env_key is None:
        return facts, None
    return facts, manifest_text if manifest_text.strip() else ""
