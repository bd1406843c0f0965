"""The one progress vocabulary: library code reports progress by calling a `Progress` with one line.

Library functions take `progress: Progress = silent`; the CLI passes a callback that prints to
stderr. Anything else library code wants to say goes through `logging` (the CLI routes it to stderr).
"""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str], None]


def silent(_line: str) -> None:
    """The default Progress: says nothing."""
