"""One ddtree-ops run at a time changes a host's services: a lock on the host, held by an SSH session.

`deploy`, `rollback`, `undeploy` and `sweep` take `host_locks(...)` on every host they may change,
before they change any, and hold them until they end. The lock is `flock(1)` on LOCK_PATH on the host,
taken by a shell that an SSH session of this run keeps alive: when the run ends, however it ends
(a clean exit, Ctrl-C, SIGKILL), its ssh client sees its stdin close, the session ends, the shell exits
and the kernel drops the lock. No lock file is ever "left behind" by a dead run; a lock can only be held
by a live session. While held, the lock file describes its holder (pid, user and machine of the
ddtree-ops run, when it started, its command line, and the holding shell's pid on the host), which a
second run names when it has to wait or give up.

Hosts are locked in name order, so two runs over overlapping hosts cannot each hold a lock the other
waits for.
"""

from __future__ import annotations

import datetime as _dt
import getpass
import json
import os
import queue
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..config import Host
from ..exceptions import HostError
from ..progress import Progress
from .layout import LOCK_PATH
from .ssh import SSH, UNREACHABLE, Transport, unreachable_error

DEFAULT_LOCK_TIMEOUT_S = 5.0
BUSY_EXIT = 75  # the remote shell's status when the lock stayed taken (EX_TEMPFAIL)
RELEASE_TIMEOUT_S = 10.0

# Runs on the host (POSIX sh + util-linux flock). Protocol on stdout, one line each:
#   HELD <remote pid> <holder json>   another run holds it; waiting up to the timeout
#   BUSY <remote pid> <holder json>   still held after the timeout (exit BUSY_EXIT)
#   LOCKED                            ours; held until stdin closes
_SCRIPT = """\
lock={lock}
mkdir -p "$(dirname "$lock")" && exec 9>>"$lock" || exit 70
command -v flock >/dev/null || {{ echo "flock(1) is not installed on this host (util-linux)" >&2; exit 71; }}
holder() {{ printf '%s %s %s\\n' "$1" "$(sed -n 2p "$lock")" "$(sed -n 1p "$lock")"; }}
if ! flock -n 9; then
  holder HELD
  flock -w {timeout} 9 || {{ holder BUSY; exit {busy}; }}
fi
printf '%s\\n%s\\n' {holder} "$$" >"$lock"
echo LOCKED
cat >/dev/null 9>&-
: >"$lock"
"""


@dataclass(frozen=True)
class LockHolder:
    """Who holds a host's lock, as its lock file says."""

    remote_pid: str
    operation: str = "?"
    pid: int | str = "?"
    user: str = "?"
    machine: str = "?"
    started: str = "?"
    command: str = "?"

    @classmethod
    def parse(cls, remote_pid: str, text: str) -> LockHolder:
        try:
            doc = json.loads(text)
        except ValueError:
            doc = {}
        known = {k: doc[k] for k in ("operation", "pid", "user", "machine", "started", "command") if k in doc}
        return cls(remote_pid=remote_pid or "?", **known)

    def describe(self) -> str:
        """`deploy by pid 1234 of alice on laptop, since 2026-12-01T01:02:03Z: `ddtree-ops deploy …``"""
        return f"{self.operation} by pid {self.pid} of {self.user} on {self.machine}, since {self.started}: `{self.command}`"


class HostLockBusy(HostError):
    """Another ddtree-ops run held a host's lock for longer than this one would wait."""


def holder_document(operation: str) -> str:
    """What this run writes into a lock it holds (one JSON line; no secret: argv never carries the key)."""
    return json.dumps(
        {
            "operation": operation,
            "pid": os.getpid(),
            "user": getpass.getuser(),
            "machine": socket.gethostname(),
            "started": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300],
        },
        sort_keys=True,
    )


def lock_script(holder: str, timeout_s: float, lock_path: str = LOCK_PATH) -> str:
    """The remote command that takes the lock (see _SCRIPT's protocol)."""
    return _SCRIPT.format(lock=shlex.quote(lock_path), timeout=f"{max(timeout_s, 0):g}", busy=BUSY_EXIT,
                          holder=shlex.quote(holder))  # fmt: skip


class HostLock:
    """The lock of one host, held by a running `ssh` (see the module docstring)."""

    def __init__(self, host: Host, process: subprocess.Popen, lock_path: str):
        self.host, self.process, self.lock_path = host, process, lock_path

    def release(self) -> None:
        """End the session (close its stdin): the shell on the host exits and the lock drops."""
        try:
            if self.process.stdin:
                self.process.stdin.close()
            self.process.wait(timeout=RELEASE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()


def _lines(process: subprocess.Popen) -> queue.Queue:
    out: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in process.stdout:  # type: ignore[union-attr]
            out.put(line.rstrip("\n"))
        out.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return out


def acquire(
    host: Host,
    *,
    operation: str,
    timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    transport: Transport = SSH,
    progress: Progress | None = None,
    lock_path: str = LOCK_PATH,
    connect_timeout_s: int = 10,
) -> HostLock:
    """Take `host`'s lock, waiting up to `timeout_s` for another run to let go.

    Args:
        host: the host.
        operation: what this run does (`deploy`, `rollback`, …), written for a second run to read.
        timeout_s: how long to wait when another run holds it (0: do not wait).
        transport: the SSH seam (`Transport.open`).
        progress: told when this run has to wait, and for whom.
        lock_path: the lock file on the host.
    Returns:
        the held HostLock; `release()` it (or use `host_locks`).
    Raises:
        HostLockBusy: another run still held it after `timeout_s` (the message names the holder and how to
            clear a lock whose holder is gone).
        HostError: the host is unreachable, or the lock could not be taken (no flock(1), a read-only disk).
    """
    say = progress or (lambda _line: None)
    script = lock_script(holder_document(operation), timeout_s, lock_path)
    try:
        process = transport.open(host, script, connect_timeout_s=connect_timeout_s)
    except FileNotFoundError:
        raise HostError("the `ssh` client is not installed on this machine: install openssh-client") from None
    lines = _lines(process)
    deadline = time.monotonic() + timeout_s + connect_timeout_s + 30
    while True:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
        except queue.Empty:
            process.kill()
            raise HostError(f"host {host.name}: no answer while taking its lock {lock_path}") from None
        if line is None:
            break
        word, _, rest = line.partition(" ")
        if word == "LOCKED":
            return HostLock(host, process, lock_path)
        if word in ("HELD", "BUSY"):
            remote_pid, _, text = rest.partition(" ")
            holder = LockHolder.parse(remote_pid, text)
            if word == "HELD":
                say(f"{host.name}: waiting up to {timeout_s:g}s (--lock-timeout) for {holder.describe()}")
                continue
            process.wait()
            raise HostLockBusy(busy_message(host, holder, timeout_s, lock_path))
    process.wait()
    stderr = (process.stderr.read() if process.stderr else "").strip()
    if process.returncode == UNREACHABLE:
        raise unreachable_error(host, stderr)  # a refused host key gets the re-trust message, as every ssh call
    raise HostError(
        f"host {host.name}: could not take its lock {lock_path} (exit {process.returncode}): {stderr or 'no message'}"
    )


def busy_message(host: Host, holder: LockHolder, timeout_s: float, lock_path: str = LOCK_PATH) -> str:
    """Why this run gave up on `host`, who holds it, and how to clear it if its holder is gone."""
    login = f"ssh -p {host.ssh.port} {host.ssh.user}@{host.address}"
    return (
        f"host {host.name!r} is locked by another ddtree-ops run ({lock_path}): {holder.describe()}. "
        f"Waited {timeout_s:g}s (--lock-timeout); nothing was changed by this run. Wait for it to end (or pass a "
        f"longer --lock-timeout). The lock lives only as long as that run's SSH session: if that run is gone and "
        f"the lock stays (its control machine vanished with the session open), end the holding session on the host: "
        f"`{login} kill {holder.remote_pid}` (or `{login} fuser -k {lock_path}`)"
    )


@contextmanager
def host_locks(
    hosts: list[Host],
    *,
    operation: str,
    timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    transport: Transport = SSH,
    progress: Progress | None = None,
    lock_path: str = LOCK_PATH,
) -> Iterator[None]:
    """Hold the lock of every host in `hosts` (taken in name order) for the body of the `with`.

    Raises HostLockBusy / HostError as `acquire` does; locks already taken are released first.
    """
    with ExitStack() as held:
        for host in sorted({h.name: h for h in hosts}.values(), key=lambda h: h.name):
            lock = acquire(host, operation=operation, timeout_s=timeout_s, transport=transport, progress=progress,
                           lock_path=lock_path)  # fmt: skip
            held.callback(lock.release)
        yield
