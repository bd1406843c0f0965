"""The host lock's protocol, with its real script run by a real shell and util-linux flock on this machine.

`LocalShell` stands in for SSH at its one seam (`Transport.open`): it runs the remote command with `sh -c`
here, so every line of the lock script runs as it does on a host; the lab test
(tests/ddtree_ops/lab/test_lock_secrets_lab.py) runs it over real SSH between two real deploys.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from ddtree_ops.config import Host
from ddtree_ops.exceptions import HostError
from ddtree_ops.hosts.lock import HostLockBusy, acquire, host_locks
from ddtree_ops.hosts.ssh import Transport

pytestmark = pytest.mark.skipif(shutil.which("flock") is None, reason="flock(1) (util-linux) is not installed here")

HOST = Host(name="gpu-1", address="10.0.0.11")


class LocalShell(Transport):
    def open(self, host, remote_command, *, connect_timeout_s=10):
        return subprocess.Popen(["sh", "-c", remote_command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, bufsize=1)  # fmt: skip


@pytest.fixture
def lock_path(tmp_path):
    return str(tmp_path / "state" / "deploy.lock")


def test_a_second_run_waits_then_gives_up_naming_the_holder_and_how_to_clear_it(lock_path):
    first = acquire(HOST, operation="deploy", transport=LocalShell(), lock_path=lock_path)
    lines: list[str] = []
    started = time.monotonic()
    with pytest.raises(HostLockBusy) as busy:
        acquire(HOST, operation="rollback", timeout_s=0.6, transport=LocalShell(), progress=lines.append, lock_path=lock_path)
    waited = time.monotonic() - started
    message = str(busy.value)
    assert 0.5 <= waited < 10, waited
    assert busy.value.exit_code == 1
    assert f"host 'gpu-1' is locked by another ddtree-ops run ({lock_path}): deploy by pid {os.getpid()}" in message
    assert "since 20" in message and "Waited 0.6s (--lock-timeout)" in message and "nothing was changed" in message
    remote_pid = open(lock_path).read().splitlines()[1]
    assert f"`ssh -p 22 root@10.0.0.11 kill {remote_pid}`" in message, "how to clear a lock whose holder is gone"
    assert lines and lines[0].startswith("gpu-1: waiting up to 0.6s (--lock-timeout) for deploy by pid")
    first.release()
    assert open(lock_path).read() == "", "a released lock no longer names a holder"
    acquire(HOST, operation="rollback", timeout_s=0, transport=LocalShell(), lock_path=lock_path).release()


def test_the_advice_for_a_stale_lock_clears_it(lock_path):
    # A holder whose session stays open though its run is gone: the message's `kill REMOTE_PID` frees the host.
    stale = acquire(HOST, operation="deploy", transport=LocalShell(), lock_path=lock_path)
    with pytest.raises(HostLockBusy) as busy:
        acquire(HOST, operation="deploy", timeout_s=0, transport=LocalShell(), lock_path=lock_path)
    remote_pid = str(busy.value).split(" kill ")[1].split("`")[0]
    os.kill(int(remote_pid), signal.SIGTERM)
    acquire(HOST, operation="deploy", timeout_s=5, transport=LocalShell(), lock_path=lock_path).release()
    stale.release()


def test_a_waiting_run_gets_the_lock_when_the_holder_lets_go(lock_path):
    first = acquire(HOST, operation="deploy", transport=LocalShell(), lock_path=lock_path)
    threading.Timer(0.5, first.release).start()
    second = acquire(HOST, operation="deploy", timeout_s=20, transport=LocalShell(), lock_path=lock_path)
    assert '"operation": "deploy"' in open(lock_path).read()
    second.release()




def test_a_sigkilled_holder_leaves_no_lock_behind(lock_path, tmp_path):
    # A separate interpreter takes the lock and is killed with SIGKILL: no cleanup of its own runs.
    program = textwrap.dedent(f"""
        import subprocess, sys, time
        from ddtree_ops.config import Host
        from ddtree_ops.hosts.lock import acquire
        from ddtree_ops.hosts.ssh import Transport

        class LocalShell(Transport):
            def open(self, host, remote_command, *, connect_timeout_s=10):
                return subprocess.Popen(["sh", "-c", remote_command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, bufsize=1)

        acquire(Host(name="gpu-1", address="10.0.0.11"), operation="deploy", transport=LocalShell(), lock_path={lock_path!r})
        print("held", flush=True)
        time.sleep(600)
    """)
    holder = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(HostLockBusy):
            acquire(HOST, operation="deploy", timeout_s=0, transport=LocalShell(), lock_path=lock_path)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        # Its shell sees its stdin close, exits, and the kernel drops the flock: a new run waits at most briefly.
        acquire(HOST, operation="deploy", timeout_s=10, transport=LocalShell(), lock_path=lock_path).release()
    finally:
        if holder.poll() is None:
            holder.kill()


def test_host_locks_take_every_host_and_release_them_all(lock_path, tmp_path):
    hosts = [Host(name="b", address="10.0.0.2"), Host(name="a", address="10.0.0.1")]
    taken: list[str] = []

    class PerHost(LocalShell):  # one lock file per host, as on two machines
        def open(self, host, remote_command, *, connect_timeout_s=10):
            taken.append(host.name)
            return super().open(host, remote_command.replace(lock_path, f"{lock_path}.{host.name}"))

    with host_locks(hosts, operation="deploy", transport=PerHost(), lock_path=lock_path):
        assert taken == ["a", "b"], "name order: two runs over the same hosts cannot deadlock"
        for name in ("a", "b"):
            assert '"operation": "deploy"' in open(f"{lock_path}.{name}").read()
    for name in ("a", "b"):
        assert open(f"{lock_path}.{name}").read() == ""


def test_a_host_that_cannot_take_the_lock_is_a_host_error(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(HostError, match="could not take its lock"):
        acquire(HOST, operation="deploy", transport=LocalShell(), lock_path=str(blocked / "deploy.lock"))
