"""The errors library code raises; only the CLI turns them into messages and exit codes."""

from __future__ import annotations

import os

import yaml


class DdtreeOpsError(Exception):
    """Base class. `exit_code` is what the CLI exits with."""

    exit_code = 1


class ConfigError(DdtreeOpsError):
    """Bad input: a malformed project file or command-line arguments. Nothing was touched."""

    exit_code = 2


class HostError(DdtreeOpsError):
    """A host failed (unreachable, a playbook failed, a health gate failed)."""

    exit_code = 1


class CheckFailed(DdtreeOpsError):
    """A check ran and found a problem."""

    exit_code = 1


class HostKeyError(HostError):
    """A host's SSH key is not recorded in the project's known_hosts, or differs from the one recorded:
    nothing was run on it (`ddtree-ops hosts trust HOST [--replace]` records it)."""

    exit_code = 1


def yaml_error_message(err: yaml.YAMLError, path: str | os.PathLike, text: str) -> str:
    """`ddtree.yaml:7:3: not valid YAML: <problem>`, the offending line quoted with a caret under the column.

    PyYAML names the stream `<unicode string>` when it parses text; this names the file instead.

    Args:
        err: what yaml.safe_load raised.
        path: the file the text came from.
        text: the file's text (to quote the line).
    Returns:
        the message of the ConfigError.
    """
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    if mark is None:
        return f"{path}: not valid YAML: {problem}"
    line, column = mark.line + 1, mark.column + 1
    message = f"{path}:{line}:{column}: not valid YAML: {problem}"
    context_mark = getattr(err, "context_mark", None)
    if context and context_mark is not None and context_mark.line != mark.line:
        message += f" ({context} at line {context_mark.line + 1})"
    elif context:
        message += f" ({context})"
    lines = text.splitlines()
    if 0 < line <= len(lines):
        source_line = lines[line - 1]
        quoted = source_line.replace("\t", " ")  # one column per tab, so the caret stays under it
        message += f"\n  {line:>4} | {quoted}\n       | {' ' * mark.column}^"
        if "\t" in source_line:
            message += "\n  YAML indents with spaces, not tabs"
    return message
