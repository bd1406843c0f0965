"""Version comparisons (driver, CUDA, Python, glibc) through `packaging.version`, never `split(".")`."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version


def parse(text: str | None) -> Version | None:
    """`"575.57.08"` -> Version; None when `text` is empty or not a version."""
    try:
        return Version(str(text)) if text else None
    except InvalidVersion:
        return None


def at_least(have: str | None, need: str | None) -> bool:
    """Whether version `have` is >= `need` (False when `have` is missing or unreadable)."""
    have_v, need_v = parse(have), parse(need)
    return have_v is not None and need_v is not None and have_v >= need_v


def major(text: str) -> str:
    """`"13.0"` -> `"13"`."""
    return str(Version(text).major)


def major_minor(text: str | None) -> tuple[int, int] | None:
    """`"3.12.3"` -> (3, 12): what a Python's wheels are tagged by (None when unreadable)."""
    v = parse(text)
    if v is None or len(v.release) < 2:
        return None
    return v.release[0], v.release[1]


def python_tag(text: str | None) -> str | None:
    """`"3.12.3"` -> `"cp312"` (None when unreadable)."""
    mm = major_minor(text)
    return f"cp{mm[0]}{mm[1]}" if mm else None
