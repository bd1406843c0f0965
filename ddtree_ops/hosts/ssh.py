"""The one door SSH leaves through (Ansible aside): every `ssh` command of ddtree-ops is run by a Transport.

Code that reaches a host takes a `transport` argument (default `SSH`, the real `ssh` client), so a
test can stand in front of every SSH command by passing its own Transport (override `call`).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import IO

from ..config import Host
from ..exceptions import HostError, HostKeyError
from .known_hosts import host_key_message, host_key_problem

# Host keys are checked against the project's known_hosts only (not ~/.ssh/known_hosts, not the system's),
# never added by ssh itself (`ddtree-ops hosts trust` and `lab up` record them); the Ansible inventory
# (hosts/inventory.py) passes the same options, so both paths see hosts the same way.
SSH_OPTIONS = ("BatchMode=yes", "StrictHostKeyChecking=yes", "LogLevel=ERROR")
UNREACHABLE = 255  # ssh's own exit status when it could not connect (or refused the host's key)


def host_key_options(host: Host) -> tuple[str, ...]:
    """The `-o` options that make ssh check `host`'s key against its project's known_hosts, and only there."""
    return (
        f"UserKnownHostsFile={host.known_hosts}",
        "GlobalKnownHostsFile=/dev/null",
        "HashKnownHosts=no",
        "CheckHostIP=no",
        "UpdateHostKeys=no",
    )


def ssh_argv(host: Host, remote_command: str, connect_timeout_s: int = 10) -> list[str]:
    """The `ssh` command line for one non-interactive command on `host` (its key checked: `host_key_options`)."""
    argv = ["ssh", "-p", str(host.ssh.port)]
    for option in (*SSH_OPTIONS, *host_key_options(host), f"ConnectTimeout={connect_timeout_s}"):
        argv += ["-o", option]
    if host.ssh.key:
        argv += ["-i", str(Path(host.ssh.key).expanduser())]
    return argv + [f"{host.ssh.user}@{host.address}", remote_command]


def unreachable_error(host: Host, stderr: str) -> HostError:
    """What an ssh exit 255 means: a refused host key (HostKeyError, with the re-trust command), or unreachable."""
    problem = host_key_problem(stderr)
    if problem is not None:
        return HostKeyError(host_key_message(host, problem, stderr))
    return HostError(
        f"host {host.name} ({host.ssh.user}@{host.address}:{host.ssh.port}) is unreachable over SSH: "
        f"{stderr.strip() or 'no message'}"
    )


class Transport:
    """Runs commands on hosts over SSH. `call` is the seam; `exec` and `run` judge its result."""

    def call(
        self,
        host: Host,
        remote_command: str,
        *,
        timeout_s: float,
        input_text: str | None = None,
        stdin: IO[bytes] | None = None,
        connect_timeout_s: int = 10,
    ) -> subprocess.CompletedProcess:
        """Run `remote_command` on `host` and return the finished process (text output), unjudged.

        Args:
            input_text: sent on the command's stdin; `stdin`: a pipe to read it from instead.
        Raises:
            subprocess.TimeoutExpired: no answer within `timeout_s`.
            FileNotFoundError: there is no ssh client on this machine.
        """
        argv = ssh_argv(host, remote_command, connect_timeout_s=connect_timeout_s)
        if stdin is not None:
            return subprocess.run(argv, stdin=stdin, capture_output=True, text=True, timeout=timeout_s)
        return subprocess.run(argv, input=input_text, capture_output=True, text=True, timeout=timeout_s)

    def open(self, host: Host, remote_command: str, *, connect_timeout_s: int = 10) -> subprocess.Popen:
        """Start `remote_command` on `host` and return the running `ssh` (text pipes on stdin, stdout, stderr).

        For a session that must outlive one call (hosts/lock.py holds a lock for as long as it runs): closing
        its stdin ends it. The caller reads and waits.

        Raises:
            FileNotFoundError: there is no ssh client on this machine.
        """
        argv = ssh_argv(host, remote_command, connect_timeout_s=connect_timeout_s)
        # Keep-alives: this end notices within a minute when the host has gone away under a held session.
        argv[1:1] = ["-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3"]
        return subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
        )

    def exec(
        self,
        host: Host,
        remote_command: str,
        *,
        timeout_s: float,
        what: str = "ssh",
        input_text: str | None = None,
        stdin: IO[bytes] | None = None,
        connect_timeout_s: int = 10,
    ) -> subprocess.CompletedProcess:
        """Run `remote_command` on `host`; the caller judges the exit status.

        Raises:
            HostKeyError: the host's key is not recorded in its project's known_hosts, or differs from it.
            HostError: no answer within `timeout_s` (naming `what`), no ssh client here, or the host
                is unreachable (ssh's own exit status 255).
        """
        try:
            proc = self.call(
                host, remote_command, timeout_s=timeout_s, input_text=input_text, stdin=stdin,
                connect_timeout_s=connect_timeout_s,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise HostError(f"host {host.name} ({host.address}): {what} did not finish within {timeout_s:.0f}s") from None
        except FileNotFoundError:
            raise HostError("the `ssh` client is not installed on this machine: install openssh-client") from None
        if proc.returncode == UNREACHABLE:
            raise unreachable_error(host, proc.stderr)
        return proc

    def run(self, host: Host, remote_command: str, timeout_s: float = 30.0) -> str:
        """Run a read-only command on `host` and return its stdout.

        Raises:
            HostError: the host did not answer, or the command failed (with its stderr).
        """
        proc = self.exec(host, remote_command, timeout_s=timeout_s)
        if proc.returncode != 0:
            raise HostError(
                f"host {host.name}: `{remote_command}` exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}"
            )
        return proc.stdout


SSH = Transport()  # the real ssh client: the default every host-facing function takes
