"""The one shape of every `--json` document: the common envelope, and the error document.

Every command's document starts with the same keys (the JSON Schemas in `ddtree_ops/schemas/`
describe each command's; `common.json` the shared parts):

- `ok` (bool): the command's verdict (exit 0 when true);
- `command` (str): `deploy`, `lab up`, … (the words after `ddtree-ops`);
- `warnings` (list of str);
- `failures` (list of `{host, service, message}`; `host`/`service` null where a failure is not one
  host's or one service's);
- `hosts` (list of `{host, …}`) wherever the result is per host, services nested inside.

An exit-1/2 error that ends a command before it has a document (bad input, an unreachable
host) is, in `--json` mode, `{"ok": false, "command", "error": {"message", "exit_code", "kind"}}`.
"""

from __future__ import annotations

from typing import Any

import click

from ..exceptions import CheckFailed, ConfigError, DdtreeOpsError, HostError

JSON_FLAG = "--json"
# `ctx.obj` keys: this invocation asked for JSON; a document was already written to stdout.
OBJ_JSON = "json_mode"
OBJ_EMITTED = "json_emitted"


def command_name(ctx: click.Context) -> str:
    """The command's words after the program name: `deploy`, `lab up`."""
    names = []
    while ctx.parent is not None:
        names.append(ctx.info_name or ctx.command.name or "")
        ctx = ctx.parent
    return " ".join(reversed(names))


def _derived_failures(doc: dict[str, Any]) -> list[dict[str, Any]]:
    # Documents built before the envelope (provision, provision --plan) list a failed host as a
    # hosts[] entry with `ok`/`manifest_ok` false: each becomes one failure naming that host.
    failures = []
    for entry in doc.get("hosts") or []:
        if not isinstance(entry, dict) or (entry.get("ok") is not False and entry.get("manifest_ok") is not False):
            continue
        refusal = entry.get("refusal") if isinstance(entry.get("refusal"), dict) else {}
        message = (
            entry.get("error")
            or refusal.get("message")
            or "; ".join(entry.get("manifest_failures") or [])
            or f"the engine environment failed its ABI manifest: {entry.get('manifest')}"
        )
        failures.append({"host": entry.get("host"), "service": None, "message": str(message)})
    return failures


def envelope(doc: dict[str, Any], command: str) -> dict[str, Any]:
    """`doc` with the common envelope's keys first (`ok`, `command`, `warnings`, `failures`).

    Args:
        doc: a command's document; it must say `ok`.
        command: what `command_name` returns.

    Returns:
        a new dict; `warnings`/`failures` default to [] (failures derived from failed hosts[] entries).
    """
    if "ok" not in doc:
        raise ValueError(f"a --json document must say 'ok' ({command}: keys {sorted(doc)})")
    rest = {k: v for k, v in doc.items() if k not in ("ok", "command", "warnings", "failures")}
    failures = doc["failures"] if "failures" in doc else _derived_failures(doc)
    return {"ok": doc["ok"], "command": command, "warnings": list(doc.get("warnings") or []),
            "failures": list(failures), **rest}  # fmt: skip


def error_kind(err: BaseException) -> str:
    """`config` (bad input), `usage` (click's own), `host`, `check`, or `error`."""
    if isinstance(err, ConfigError):
        return "config"
    if isinstance(err, click.UsageError):
        return "usage"
    if isinstance(err, HostError):
        return "host"
    if isinstance(err, CheckFailed):
        return "check"
    return "error"


def error_document(command: str, err: DdtreeOpsError | click.UsageError) -> dict[str, Any]:
    """The one error shape of `--json` mode (exit 1 or 2, before a command had its own document)."""
    exit_code = err.exit_code
    message = err.format_message() if isinstance(err, click.ClickException) else str(err)
    return {"ok": False, "command": command,
            "error": {"message": message, "exit_code": exit_code, "kind": error_kind(err)}}  # fmt: skip


def asked_for_json(ctx: click.Context) -> bool:
    """Whether this invocation is in `--json` mode: the option said so, or (when parsing failed
    before options were read) `--json` is among the raw arguments."""
    obj = ctx.find_root().obj or {}
    if obj.get(OBJ_JSON):
        return True
    return JSON_FLAG in obj.get("raw_args", ())
