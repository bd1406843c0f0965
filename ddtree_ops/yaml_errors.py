"""The message a project file that is not valid YAML gets: file, line and column, the line quoted."""

from __future__ import annotations

import os

import yaml


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
