"""Where the CLI's tables go: a rich console on stdout that never cuts a table to 80 columns."""

from __future__ import annotations

import sys

from rich.console import Console

# Piped or redirected output has no width to fit: rich's 80-column default would cut release ids
# and paths (`/opt/ddtr…`), so tables get all the room they need instead.
UNBOUNDED_WIDTH = 100_000


def console() -> Console:
    """A console on stdout: the terminal's width on a terminal, no limit otherwise.

    Returns:
        the console (made per call: stdout may have been replaced, as under click's CliRunner).
    """
    if sys.stdout.isatty():
        return Console()
    return Console(width=UNBOUNDED_WIDTH, soft_wrap=True)
