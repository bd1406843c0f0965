"""What every command shares: the project file (`-c`, before or after the command), `--hosts`, JSON
output, errors to exit codes, the order commands are listed in."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..config import CONFIG_ENV, DEFAULT_CONFIG_NAME, Project, load_project
from ..exceptions import ConfigError, DdtreeOpsError
from ..hosts.ansible import run_playbook
from ..hosts.lock import DEFAULT_LOCK_TIMEOUT_S, host_locks
from ..hosts.ssh import SSH, Transport
from ..lab.identity import CONFIG_NAME, MARKER, default_lab_dir
from ..service.api_key import export_api_key, resolve_api_key
from . import envelope


@contextmanager
def live_table(first: Table) -> Iterator[Callable[[Table], None]]:
    """The CLI's Ansible Display: the per-host progress table, redrawn in place on stderr."""
    console = Console(stderr=True)
    with Live(first, console=console, refresh_per_second=4, transient=False) as live:
        yield live.update
    if not console.is_terminal:
        console.line()  # rich ends the last frame without a newline when stderr is not a terminal


@dataclass(frozen=True)
class Seams:
    """The side effects every command hands to the library: the Ansible runner and the SSH transport.

    The real ones by default; a test passes its own through click's `obj`
    (`CliRunner().invoke(cli, args, obj={"seams": Seams(run_playbook=fake)})`).
    """

    run_playbook: Callable[..., Any] = field(default_factory=lambda: functools.partial(run_playbook, display=live_table))
    transport: Transport = SSH


def seams_from(ctx: click.Context) -> Seams:
    """The Seams of this invocation (the real ones unless a caller passed others)."""
    return (ctx.find_root().obj or {}).get("seams") or Seams()


def say(line: str) -> None:
    """The CLI's Progress: one line on stderr."""
    click.echo(line, err=True)


def project_path(explicit: str | None) -> Path:
    """Which project file this invocation reads: `-c`, else `$DDTREE_CONFIG`, else `./ddtree.yaml`,
    else the default lab's (what `ddtree-ops lab up` wrote; a note on stderr says so).

    The lab's file is the last resort only: a real project (`-c`, `$DDTREE_CONFIG`, `./ddtree.yaml`)
    always wins, and the fallback can only ever point at local lab containers.

    Args:
        explicit: the `-c/--config` value, if given.

    Returns:
        The path to load (it exists unless `-c` or `$DDTREE_CONFIG` named a missing file).

    Raises:
        ConfigError: none of them exists; the message gives the exact `export DDTREE_CONFIG=…` line.
    """
    if explicit:
        return Path(explicit)
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    local = Path(DEFAULT_CONFIG_NAME)
    if local.exists():
        return local
    lab_dir = default_lab_dir().expanduser()
    lab_config = lab_dir / CONFIG_NAME
    if lab_config.exists() and (lab_dir / MARKER).exists():
        note = f"using the lab's project file {lab_config} (no -c, no ${CONFIG_ENV}, no ./{DEFAULT_CONFIG_NAME})"
        click.echo(note, err=True)
        return lab_config
    here = labs_here()
    found = (
        " A lab made here with `lab up --dir`: " + "; ".join(f"`export {CONFIG_ENV}={c}` (or `-c {c}`)" for c in here) + "."
        if here else ""
    )  # fmt: skip
    raise ConfigError(
        f"no project file: no -c PATH, no ${CONFIG_ENV}, no ./{DEFAULT_CONFIG_NAME} and no lab's at {lab_config}.{found} "
        f"Name one with `export {CONFIG_ENV}=/path/to/ddtree.yaml` (a lab made with `lab up --dir DIR`: "
        f"`export {CONFIG_ENV}=DIR/{CONFIG_NAME}`), write one with `ddtree-ops init`, or start the default "
        "lab with `ddtree-ops lab up` (then commands find its file)"
    )


def labs_here() -> list[Path]:
    """The project files of labs in the current folder or one level below (`lab up --dir ./.lab`), by their
    `lab.json`: named in the "no project file" error with the exact line to use, never read by themselves."""
    markers = [Path(MARKER), *sorted(Path().glob(f"*/{MARKER}"))]
    return [(m.parent / CONFIG_NAME).absolute() for m in markers if m.exists() and (m.parent / CONFIG_NAME).exists()]


CONFIG_KEY = "ddtree_ops.config_path"  # in the root context's `meta`: fresh for every invocation
CONFIG_HELP = (
    "Project file (default: $DDTREE_CONFIG, else ./ddtree.yaml, else the default lab's). "
    "Accepted before or after the command name."
)


def _remember_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """`-c` may come before the command (`ddtree-ops -c F doctor`) or after it (`ddtree-ops doctor -c F`):
    both land in one place, with the same precedence; two different files are a usage error."""
    if value is None:
        return None
    meta = ctx.find_root().meta
    earlier = meta.get(CONFIG_KEY)
    if earlier is not None and Path(earlier) != Path(value):
        raise click.UsageError(f"-c/--config given twice with different files ({earlier} and {value}): give one", ctx=ctx)
    meta[CONFIG_KEY] = value
    return value


_CONFIG_DECLS = ("-c", "--config", "config_path")
_CONFIG_ATTRS = dict(
    type=click.Path(dir_okay=False), default=None, expose_value=False, callback=_remember_config, help=CONFIG_HELP, metavar="FILE"
)


def config_param() -> click.Option:
    """The `-c/--config` option: it stores the path for `project_from` and passes nothing to the command."""
    return click.Option(list(_CONFIG_DECLS), **_CONFIG_ATTRS)


def config_option(f):
    """Decorator: `-c/--config FILE` on a command function (the same option the group takes)."""
    return click.option(*_CONFIG_DECLS, **_CONFIG_ATTRS)(f)


def with_config_option(command: click.Command) -> click.Command:
    """Give an already-built command the shared `-c/--config` option (once; idempotent).

    Args:
        command: a command that reads the project file.
    Returns:
        the same command.
    """
    if not any(p.name == "config_path" for p in command.params):
        command.params.insert(0, config_param())
    return command


def project_from(ctx: click.Context, api_key: bool = True) -> Project:
    """The validated project file for this invocation (raises ConfigError, exit 2); see `project_path`.

    Args:
        ctx: the command's context.
        api_key: the command uses the services' API key (deploy writes it, the HTTP checks send it): its
            source (`api_key_env` / `api_key_file`) is checked, and the key becomes this process's
            `$DDTREE_API_KEY`, where deploy and the HTTP client read it (`service/api_key.py`). Commands
            that never use it (provision, doctor, hosts trust, undeploy) pass False and run without it.
    """
    path = project_path(ctx.find_root().meta.get(CONFIG_KEY))
    project = load_project(path)
    if api_key:
        export_api_key(resolve_api_key(project, path.parent))
    return project


def next_step(ctx: click.Context, command: str, why: str = "") -> None:
    """Suggest the command to run next, on stderr, with this invocation's `-c FILE` when one was given."""
    config = ctx.find_root().meta.get(CONFIG_KEY)
    with_config = command.replace("ddtree-ops ", f"ddtree-ops -c {config} ", 1) if config else command
    click.echo(f"next: {with_config}" + (f"   ({why})" if why else ""), err=True)


def split_names(values: tuple[str, ...] | list[str]) -> list[str]:
    """`--hosts a,b --hosts c` -> ["a", "b", "c"] (duplicates dropped, order kept)."""
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    return list(dict.fromkeys(names))


def hosts_option(f):
    """Decorator: `--hosts H1,H2` (repeatable, comma lists), passed to the command as `hosts`."""
    return click.option(
        "--hosts", "hosts", multiple=True, metavar="H1,H2",
        help="Only these hosts (comma-separated or repeated; default: every host in the project file).",
    )(f)  # fmt: skip


class _DeprecatedArgument(click.Argument):
    """An argument still accepted but no longer shown in the usage line."""

    def get_usage_pieces(self, ctx: click.Context) -> list[str]:
        return []


def positional_hosts_argument(f):
    """Decorator: host names as arguments (`doctor gpu-1`), the form before `--hosts`; deprecated, kept
    for one release so scripts keep working (each use says so on stderr). Passed as `positional_hosts`."""
    return click.argument("positional_hosts", nargs=-1, cls=_DeprecatedArgument)(f)


def hosts_from(command: str, option_values: tuple[str, ...], positional: tuple[str, ...]) -> list[str]:
    """The host names of `--hosts`, plus any given the old positional way (with a deprecation note on stderr).

    Args:
        command: the command's name, for the note.
        option_values: the `--hosts` values.
        positional: host names given as arguments (deprecated).
    Returns:
        the names (empty: every host).
    """
    if positional:
        click.echo(
            f"deprecated: `{command} {' '.join(positional)}` — name hosts with `{command} --hosts {','.join(positional)}`; "
            "host names as arguments stop working in the next release",
            err=True,
        )
    return split_names(tuple(option_values) + tuple(positional))


def lock_timeout_option(f):
    """Decorator: `--lock-timeout SECONDS`, how long to wait for another run's lock on a host (`lock_timeout`)."""
    return click.option(
        "--lock-timeout", "lock_timeout", type=click.FloatRange(min=0), default=DEFAULT_LOCK_TIMEOUT_S, show_default=True,
        help="Seconds to wait when another ddtree-ops run holds a host's lock; then exit 1 naming it (0: do not wait).",
    )(f)  # fmt: skip


@contextmanager
def locked(ctx: click.Context, hosts: list, operation: str, timeout_s: float) -> Iterator[None]:
    """Hold the lock of each of `hosts` on the host itself (hosts/lock.py) while the body changes them."""
    with host_locks(hosts, operation=operation, timeout_s=timeout_s, transport=seams_from(ctx).transport, progress=say):
        yield


def _mark_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    # Remembered on the root so that an error ending the command is written as JSON too.
    if value:
        obj = ctx.find_root().ensure_object(dict)
        obj[envelope.OBJ_JSON] = True
        obj["json_command"] = envelope.command_name(ctx)
    return value


def json_option(f):
    return click.option(
        "json_", "--json", is_flag=True, callback=_mark_json,
        help="Print one JSON document (the common envelope: README \"JSON output\") instead of a table.",
    )(f)  # fmt: skip


def emit_json(data: Any) -> None:
    """Write `data` as the command's one JSON document, in the common envelope (`envelope.envelope`)."""
    ctx = click.get_current_context()
    root = ctx.find_root().ensure_object(dict)
    root[envelope.OBJ_EMITTED] = True
    click.echo(json.dumps(envelope.envelope(data, envelope.command_name(ctx)), indent=2, default=str))


def _command_words(group: click.Group, tokens: list[str]) -> str:
    # Which command the raw arguments name (`lab up`), for an error raised before it was parsed.
    words, command = [], group
    for token in tokens:
        if not isinstance(command, click.Group) or token not in command.commands:
            break
        words.append(token)
        command = command.commands[token]
    return " ".join(words)


class InOrderGroup(click.Group):
    """A click group that lists its commands in the order they were added (the order of the flow:
    `init, lab, hosts, doctor, provision, …`; `lab up, status, down`), not alphabetically."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


class DdtreeGroup(InOrderGroup):
    """The root group: it turns library exceptions into a message on stderr and their exit code.

    Doing it here (not in `main`) means CliRunner tests see the same exit codes as users.
    """

    def invoke(self, ctx: click.Context):
        obj = ctx.ensure_object(dict)
        obj["raw_args"] = [*ctx._protected_args, *ctx.args]
        try:
            return super().invoke(ctx)
        except (DdtreeOpsError, click.UsageError) as err:
            # --json: one document on stdout, always; the error's own unless the command wrote one.
            if envelope.asked_for_json(ctx) and not obj.get(envelope.OBJ_EMITTED):
                command = obj.get("json_command") or _command_words(self, obj["raw_args"])
                click.echo(json.dumps(envelope.error_document(command, err), indent=2))
            elif isinstance(err, click.UsageError):
                raise
            if isinstance(err, click.UsageError):
                err.show()
            else:
                click.echo(f"error: {err}", err=True)
            ctx.exit(err.exit_code)
