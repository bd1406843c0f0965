"""Every tracked Python file of the repository passes pyflakes: no unused import or variable, no
undefined name, no redefinition, no syntax error.

No allow-list: a file that needs an import only for its side effect says so in code
(`importlib.util.find_spec`, as provision/wheelhouse.py does), and SGLang's `A` alias for
`typing.Annotated` is spelled `Annotated` (sglang_plugin/flags.py), so pyflakes reads its help
strings as metadata, not forward annotations. The measured scripts under benchmarks/results/ are
included: they are kept as they ran, and that is no reason to keep dead code in them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pyflakes import api, reporter

ROOT = Path(__file__).resolve().parents[1]


class _Collect(reporter.Reporter):
    def __init__(self) -> None:
        self.messages: list[str] = []

    def unexpectedError(self, filename, msg):  # noqa: N802 (pyflakes' names)
        self.messages.append(f"{filename}: {msg}")

    def syntaxError(self, filename, msg, lineno, offset, text):  # noqa: N802
        self.messages.append(f"{filename}:{lineno}: {msg}")

    def flake(self, message):
        self.messages.append(str(message))


def _flakes(paths: list[Path]) -> list[str]:
    out = _Collect()
    for path in paths:
        api.checkPath(str(path), out)
    return out.messages


def _tracked_python() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def test_every_tracked_python_file_passes_pyflakes():
    paths = _tracked_python()
    assert len(paths) > 100, f"only {len(paths)} tracked .py files found under {ROOT}"
    messages = _flakes(paths)
    assert messages == [], "pyflakes:\n" + "\n".join(messages)


def test_the_check_sees_what_it_is_for(tmp_path):
    """The same check on made-up files that break it: it must report each."""
    bad = {
        "unused.py": "import os\n",
        "undefined.py": "def f():\n    return missing_name\n",
        "alias.py": 'from typing import Annotated as A\nx: A[int, "some help text."] = 1\n',
        "broken.py": "def f(:\n",
    }
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
    messages = _flakes(sorted(tmp_path.iterdir()))
    for name in bad:
        assert any(name in m for m in messages), (name, messages)
    good = tmp_path / "good.py"
    good.write_text('from typing import Annotated\nx: Annotated[int, "some help text."] = 1\n')
    assert _flakes([good]) == []
