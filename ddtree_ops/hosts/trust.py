"""`ddtree-ops hosts trust`: fetch each host's SSH keys, show their fingerprints, record them (trust on
first use, made explicit).

A host whose recorded keys differ from what it offers now is refused unless `replace` is set; then
only that host's old entries are removed. Hosts are scanned in parallel (one `ssh-keyscan` each).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from ..config import Host
from ..exceptions import HostError
from .known_hosts import HostKey, parse_keyscan, pattern_of, record_keys, recorded_keys, trust_command

RECORDED, UNCHANGED, REPLACED, CHANGED, FAILED = "recorded", "unchanged", "replaced", "changed", "failed"
MAX_PARALLEL_SCANS = 16

# host -> the keys it offers now (raises HostError when it offers none)
Scanner = Callable[[Host], list[HostKey]]


@dataclass
class KeyRow:
    key_type: str
    fingerprint: str


@dataclass
class TrustResult:
    host: str
    pattern: str  # the name in known_hosts: ADDRESS, or [ADDRESS]:PORT
    known_hosts: str
    status: str  # recorded | unchanged | replaced | changed (refused) | failed
    keys: list[KeyRow] = field(default_factory=list)  # what the host offers now
    previous: list[KeyRow] = field(default_factory=list)  # what was recorded before, when it differs
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status in (RECORDED, UNCHANGED, REPLACED)

    def to_dict(self) -> dict:
        return {"ok": self.ok, **asdict(self)}


def keyscan(host: Host, timeout_s: int = 10) -> list[HostKey]:
    """The keys `host` offers on its SSH port, by `ssh-keyscan` (port aware).

    Raises:
        HostError: nothing answered, or the scan failed.
    """
    argv = ["ssh-keyscan", "-T", str(timeout_s), "-p", str(host.ssh.port), host.address]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s * 3 + 5)
    except FileNotFoundError:
        raise HostError("`ssh-keyscan` is not installed on this machine: install openssh-client") from None
    except subprocess.TimeoutExpired:
        raise HostError(f"host {host.name}: ssh-keyscan got no answer from {host.address}:{host.ssh.port}") from None
    keys = parse_keyscan(proc.stdout)
    if not keys:
        why = " ".join(line for line in proc.stderr.splitlines() if not line.startswith("#")).strip()
        raise HostError(
            f"host {host.name}: no SSH host key from {host.address}:{host.ssh.port} "
            f"({why or 'nothing answered'}); check the host is up and its address and ssh.port"
        )
    return keys


def _rows(keys: list[HostKey]) -> list[KeyRow]:
    return [KeyRow(k.key_type, k.fingerprint) for k in keys]


def trust_host(host: Host, offered: list[HostKey], replace: bool = False) -> TrustResult:
    """Record `offered` for `host` in its project's known_hosts, unless it conflicts with what is there.

    Args:
        offered: the keys the host offers now (from `keyscan`).
        replace: a host whose recorded keys differ gets `offered` instead (its old entries only are removed).
    Returns:
        the outcome: `recorded` (none were there), `unchanged`, `replaced`, or `changed` (refused, nothing written).
    """
    pattern, path = pattern_of(host), host.known_hosts
    before = recorded_keys(path, pattern)
    result = TrustResult(host.name, pattern, str(path), RECORDED, keys=_rows(offered))
    if before and set(before) == set(offered):
        result.status = UNCHANGED
        return result
    if before:
        result.previous = _rows(before)
        if not replace:
            result.status = CHANGED
            result.error = (
                f"host {host.name} ({pattern}) offers other SSH host keys than {path} records for it: a re-keyed "
                "or reinstalled host, or a man in the middle. Nothing was written. Confirm the new fingerprints "
                f"with the host's console or owner, then run `{trust_command(host, replace=True)}`"
            )
            return result
        result.status = REPLACED
    record_keys(path, pattern, offered, replace=replace)
    return result


def trust_hosts(hosts: list[Host], replace: bool = False, scan: Scanner = keyscan) -> list[TrustResult]:
    """Scan every host (in parallel) and record its keys (`trust_host`), in the order given.

    Args:
        hosts: the hosts to trust (already selected: unknown names are the caller's error).
        replace: replace a host's recorded keys when they differ from what it offers now.
        scan: host -> the keys it offers (default: `ssh-keyscan`).
    Returns:
        one result per host; a host that could not be scanned is `failed` with the reason.
    """
    def scanned(host: Host) -> list[HostKey] | HostError:
        try:
            return scan(host)
        except HostError as err:
            return err

    with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL_SCANS, len(hosts)))) as pool:
        offers = list(pool.map(scanned, hosts))
    results = []
    for host, offered in zip(hosts, offers):  # written one after another: hosts may share one file
        if isinstance(offered, HostError):
            results.append(TrustResult(host.name, pattern_of(host), str(host.known_hosts), FAILED, error=str(offered)))
        else:
            results.append(trust_host(host, offered, replace))
    return results
