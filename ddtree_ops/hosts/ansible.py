"""The one place that runs Ansible: `run_playbook` over ansible-runner, with progress and a log.

Every change to a host goes through here. Progress (host, task, ok/changed/failed) is drawn on
stderr with rich; the full Ansible output is kept in a log file under the state directory, and a
failure raises `HostError` with the host, the failing task, the tail of the output and the log path.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from ..config import Host, Project
from ..exceptions import ConfigError, HostError, HostKeyError
from ..state import log_dir as default_log_dir
from ..state import repo_root
from .inventory import build_inventory
from .known_hosts import host_key_message, host_key_problem

ANSIBLE_DIR_ENV = "DDTREE_ANSIBLE_DIR"
TAIL_LINES = 25

# Shows the per-host progress table while a playbook runs: called with the first table, it gives back
# a context whose value is called with each new table. The library draws nothing itself; the CLI passes
# one that draws on stderr (cli/common.py).
Display = Callable[[Table], AbstractContextManager[Callable[[Table], None]]]


def no_display(first: Table) -> AbstractContextManager[Callable[[Table], None]]:
    """The default Display: shows nothing."""
    return nullcontext(lambda table: None)


@dataclass(frozen=True)
class HostOutcome:
    ok: int
    changed: int
    failed: int
    unreachable: bool


@dataclass(frozen=True)
class PlaybookResult:
    status: str  # ansible-runner's: successful | failed | timeout | canceled
    rc: int
    hosts: dict[str, HostOutcome]
    log_path: Path


def ansible_dir() -> Path:
    """The folder with ansible.cfg, the playbooks and roles (`$DDTREE_ANSIBLE_DIR` overrides)."""
    path = Path(os.environ.get(ANSIBLE_DIR_ENV) or repo_root() / "ansible")
    if not (path / "ansible.cfg").is_file():
        raise ConfigError(
            f"no Ansible playbooks at {path} (ansible.cfg missing): run ddtree-ops from its checkout, "
            f"or set ${ANSIBLE_DIR_ENV} to the repository's ansible/ folder"
        )
    return path


def _playbook_path(playbook: str | Path) -> Path:
    path = Path(playbook)
    if not path.is_absolute():
        path = ansible_dir() / path
    if not path.is_file():
        raise ConfigError(f"playbook {path} does not exist")
    return path


@dataclass
class _HostProgress:
    task: str = "waiting"
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: bool = False
    messages: list[str] = field(default_factory=list)


class _Progress:
    """Folds runner events into per-host progress and the failure messages we report."""

    def __init__(self, hosts: list[Host]):
        self.hosts = {h.name: _HostProgress() for h in hosts}
        self.current_task = ""

    def feed(self, event: dict) -> None:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if kind == "playbook_on_task_start":
            self.current_task = data.get("task") or ""
            return
        host = data.get("host")
        if host not in self.hosts:
            return
        hp = self.hosts[host]
        res = data.get("res") or {}
        if kind == "runner_on_start":
            hp.task = data.get("task") or self.current_task
        elif kind == "runner_on_ok":
            hp.ok += 1
            hp.changed += 1 if res.get("changed") else 0
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            hp.failed += 1
            hp.messages.append(f"task {data.get('task')!r} failed: {_result_text(res)}")
        elif kind == "runner_on_unreachable":
            hp.unreachable = True
            hp.messages.append(str(res.get("msg") or "no answer").strip())

    def table(self, title: str) -> Table:
        table = Table(title=title, title_justify="left", expand=False)
        for column in ("host", "task", "ok", "changed", "failed"):
            table.add_column(column, justify="right" if column in ("ok", "changed", "failed") else "left")
        for name, hp in self.hosts.items():
            task = "[red]unreachable[/red]" if hp.unreachable else hp.task
            failed = f"[red]{hp.failed}[/red]" if hp.failed else "0"
            table.add_row(name, task, str(hp.ok), str(hp.changed), failed)
        return table


def _result_text(res: dict) -> str:
    parts = []
    for key in ("msg", "stderr", "stdout"):
        value = res.get(key)
        if value and str(value).strip():
            text = str(value).strip()
            lines = text.splitlines()
            parts.append("\n".join(lines[-TAIL_LINES:]))
    return "\n".join(parts) or "no message"


@contextmanager
def _cancel_on_sigint() -> Iterator[Callable[[], bool]]:
    """While a playbook runs, Ctrl-C (SIGINT) cancels it instead of raising inside ansible-runner.

    Left to itself, ansible-runner installs SIGINT and SIGTERM handlers of its own and never puts
    the old ones back: a cancelled playbook then ends as "failed" (not as an interrupt), and a
    Ctrl-C after the first playbook (in deploy's health gate, say) is swallowed. Instead, this
    handler sets a flag that ansible-runner polls (`cancel_callback`, every few seconds): it kills
    ansible-playbook's process group, `run_playbook` raises KeyboardInterrupt, and the previous
    handler is back. The task already running (in an Ansible worker of its own session) may still
    finish on its host; no further task starts, and no host file is half-written either way
    (Ansible's copy and template write a temp file beside the target and rename it).
    Off the main thread (where signal handlers cannot be set) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    hit = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda _signum, _frame: hit.set())
    try:
        yield hit.is_set
    finally:
        signal.signal(signal.SIGINT, previous)


def _tail(text: str, n: int = TAIL_LINES) -> str:
    return "\n".join(line for line in text.strip().splitlines()[-n:])


def run_playbook(
    playbook: str | Path,
    project: Project,
    hosts: list[Host],
    extravars: dict,
    *,
    on_event: Callable[[dict], None] | None = None,
    log_dir: Path | None = None,
    display: Display = no_display,
) -> PlaybookResult:
    """Run one playbook against `hosts` and return the per-host outcome.

    Args:
        playbook: a path, absolute or relative to the ansible/ folder (e.g. "provision.yml").
        project: the validated project; connection settings come from its hosts.
        hosts: the hosts to run on (group `ddtree` in the inventory).
        extravars: variables passed with `-e` (role variables are prefixed `ddtree_<role>_`).
        on_event: called with every ansible-runner event dict (after progress is updated).
        log_dir: where the full log goes (default: the state dir's logs/).
        display: shows the per-host progress table (the CLI's draws it on stderr; default: nothing).
    Returns:
        PlaybookResult; `log_path` is the full Ansible output.
    Raises:
        HostError: a host was unreachable or a task failed (names the host, the reason, the log).
        ConfigError: the playbook or the ansible/ folder is missing.
        KeyboardInterrupt: Ctrl-C: the playbook was cancelled (ansible-playbook killed) first.
    """
    import ansible_runner  # deferred on purpose: slow to import (~0.5 s), and only host-changing commands need it

    path = _playbook_path(playbook)
    inventory = build_inventory(project, hosts)
    logs = Path(log_dir) if log_dir else default_log_dir()
    logs.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_path = logs / f"{stamp}-{path.stem}-{os.getpid()}.log"

    progress = _Progress(hosts)
    title = f"ansible: {path.name} on {len(hosts)} host(s)"

    bin_dir = os.path.dirname(sys.executable)
    envvars = {
        "ANSIBLE_CONFIG": str(ansible_dir() / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(ansible_dir() / "roles"),
        "ANSIBLE_NOCOLOR": "1",
        # ansible-runner sets this to False unless told otherwise: Ansible would then switch ssh's checking off.
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        # ansible-playbook must be the one installed beside this Python, not some other on PATH.
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
    }
    if shutil.which("ansible-playbook", path=envvars["PATH"]) is None:
        raise ConfigError(
            "ansible-playbook is not installed beside this Python: pip install ansible-core ansible-runner"
        )

    private_dir = Path(tempfile.mkdtemp(prefix="ddtree-runner-"))
    try:
        with display(progress.table(title)) as show, _cancel_on_sigint() as interrupted:

            def handle(event: dict) -> bool:
                progress.feed(event)
                show(progress.table(title))
                if on_event is not None:
                    on_event(event)
                return True

            runner = ansible_runner.run(
                private_data_dir=str(private_dir),
                project_dir=str(ansible_dir()),
                playbook=str(path),
                inventory=inventory,
                extravars=extravars,
                envvars=envvars,
                event_handler=handle,
                cancel_callback=interrupted,
                quiet=True,
                ident="run",
            )
        output = _read_stdout(private_dir)
        log_path.write_text(output)
        if interrupted():
            raise KeyboardInterrupt(f"{path.name} was cancelled (Ctrl-C); its log: {log_path}")
        stats = _stats(runner)
    finally:
        shutil.rmtree(private_dir, ignore_errors=True)

    outcomes = {}
    for h in hosts:
        outcomes[h.name] = HostOutcome(
            ok=int((stats.get("ok") or {}).get(h.name, 0)),
            changed=int((stats.get("changed") or {}).get(h.name, 0)),
            failed=int((stats.get("failures") or {}).get(h.name, 0)),
            unreachable=h.name in (stats.get("dark") or {}) or progress.hosts[h.name].unreachable,
        )
    result = PlaybookResult(status=runner.status, rc=int(runner.rc or 0), hosts=outcomes, log_path=log_path)
    _raise_on_failure(result, hosts, progress, output)
    return result


def _stats(runner) -> dict:
    from ansible_runner.exceptions import AnsibleRunnerException  # deferred with ansible_runner (above)

    try:
        return runner.stats or {}
    except AnsibleRunnerException:  # no stats event: ansible-playbook died before the play ran
        return {}


def _read_stdout(private_dir: Path) -> str:
    stdout = private_dir / "artifacts" / "run" / "stdout"
    return stdout.read_text(errors="replace") if stdout.exists() else ""


def _raise_on_failure(result: PlaybookResult, hosts: list[Host], progress: _Progress, output: str) -> None:
    problems, key_refused = [], False
    for h in hosts:
        outcome = result.hosts[h.name]
        messages = "; ".join(progress.hosts[h.name].messages) or "see the log"
        # Ansible reports a refused host key as "unreachable", with ssh's own words in the message.
        problem = host_key_problem(messages) if outcome.unreachable else None
        if problem is not None:
            key_refused = True
            problems.append(host_key_message(h, problem, messages))
        elif outcome.unreachable:
            key = f"-i {h.ssh.key} " if h.ssh.key else ""
            problems.append(
                f"host {h.name} ({h.address}:{h.ssh.port}) is unreachable over SSH: {messages}; "
                f"check it is up and that `ssh {key}-p {h.ssh.port} {h.ssh.user}@{h.address}` works"
            )
        elif outcome.failed:
            problems.append(f"host {h.name} ({h.address}): {messages}")
    if not problems and result.status == "successful" and result.rc == 0:
        return
    if not problems:
        problems.append(f"ansible-playbook ended {result.status} (rc {result.rc})")
    error = HostKeyError if key_refused else HostError
    raise error(
        "\n".join(problems)
        + f"\n--- last lines of the Ansible output ---\n{_tail(output)}\n--- full log: {result.log_path}"
    )
