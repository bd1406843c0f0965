"""The frozen dependency closure of an SGLang release together with the DDTree engine's dependencies.

One file per (release, CUDA flavour, Python, machine) under `knowledge/closures/`, written by
`python -m ddtree_ops.provision.closure freeze` with `uv pip compile --generate-hashes --exclude-newer DATE`
for the release's wheel platform: every package the env will hold, pinned, with its hashes. The
resolver turns it into the lock's constraints file, so nothing in the env floats. Resolving the
release's pins and the engine's requirements together is also the proof that the engine co-installs
with that SGLang release (a conflict makes the freeze fail, naming both sides).

The header records the command and the cut-off date. A bare re-freeze with that date is not always
reproducible: indexes are not append-only in time (ml-dtypes 0.7.0 became visible after the 2026-11-29
freeze with an upload time of 2026-11-16, and the resolver then takes it). So the check that a
committed file is what `freeze` makes (`tests/ddtree_ops/provision/test_closure.py`, against PyPI when
reachable) resolves again with the file's own pins as constraints (`freeze(..., constraints=)`): the
same packages, versions and hashes must come back, which fails on a hand edit, on engine requirements
changed without a re-freeze, and on a file replaced under a pinned version, but not on a new release.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import knowledge
from ..exceptions import ConfigError, DdtreeOpsError
from .engine_source import engine_metadata, engine_source_dir

CLOSURES_DIR = knowledge.KNOWLEDGE_DIR / "closures"
PYPI = "https://pypi.org/simple"
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(?P<version>[^\s\\;]+)")
_HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")


@dataclass(frozen=True)
class Closure:
    path: Path
    pins: dict[str, str]  # normalised name -> version
    hashes: dict[str, tuple[str, ...]]  # normalised name -> sha256:… of its acceptable files
    exclude_newer: str | None

    def constraint_lines(self) -> list[str]:
        return [f"{name}=={version}" for name, version in sorted(self.pins.items())]


def normalise(name: str) -> str:
    """PEP 503 name: `Flashinfer_Python` -> `flashinfer-python`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def file_name(release: str, flavour: str, python_tag: str, machine: str) -> str:
    return f"sglang-{release}-{flavour}-{python_tag}-{machine}.txt"


def uv_platform(glibc_min: str, machine: str) -> str:
    """uv's --python-platform for the release's wheels: `x86_64-manylinux_2_34`."""
    return f"{machine}-manylinux_{glibc_min.replace('.', '_')}"


def parse(text: str, path: Path) -> Closure:
    """Pins and hashes of a `uv pip compile --generate-hashes` file (continuation lines joined)."""
    pins: dict[str, str] = {}
    hashes: dict[str, list[str]] = {}
    exclude_newer = None
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("# exclude-newer:"):
            exclude_newer = line.split(":", 1)[1].strip()
        if not line or line.startswith("#"):
            continue
        match = _PIN.match(line)
        if match:
            current = normalise(match["name"])
            pins[current] = match["version"]
            hashes[current] = []
        if current:
            hashes[current] += _HASH.findall(line)
    if not pins:
        raise ConfigError(f"{path}: no pinned packages in this closure file; freeze it again")
    return Closure(path, pins, {k: tuple(v) for k, v in hashes.items()}, exclude_newer)


def load(release: str, flavour: str, python_tag: str, machine: str) -> Closure | None:
    """The committed closure, or None when none was frozen for this combination."""
    path = CLOSURES_DIR / file_name(release, flavour, python_tag, machine or "x86_64")
    if not path.is_file():
        return None
    return parse(path.read_text(), path)


def machine_of(platform: str) -> str:
    """`manylinux_2_34_aarch64` -> `aarch64` (x86_64 when the tag says nothing else)."""
    match = re.fullmatch(r"manylinux_\d+_\d+_(\w+)", platform)
    return match.group(1) if match else "x86_64"


def for_lock(lock) -> Closure | None:
    """The closure an sglang lock's constraints came from (its machine read off the wheel platform tag)."""
    return load(lock.sglang_version, lock.cuda_flavour, lock.python_tag, machine_of(lock.platform))


def engine_requirements() -> list[str]:
    """The engine's declared dependencies (from its pyproject.toml), which must co-install with SGLang."""
    return engine_metadata(engine_source_dir())[1]


def compile_inputs(release: str, flavour: str) -> list[str]:
    """What the closure is resolved from: the release's core pins (as the lock installs them) and the engine's requirements."""
    rel = knowledge.releases()["releases"][release]
    flav = rel["flavours"][flavour]
    local = flav.get("torch_local", "")
    fi = rel["flashinfer"]
    extra = f"[{fi['extra']}]" if fi.get("extra") else ""
    lines = [
        f"sglang=={release}",
        f"torch=={rel['torch']}{local}",
        f"torchvision=={rel['torchvision']}{local}",
        f"torchaudio=={rel['torchaudio']}{local}",
        f"{rel['kernel']['name']}=={rel['kernel']['version']}{flav.get('kernel_local', '')}",
        f"flashinfer-python{extra}=={fi['python']}",
    ]
    if fi.get("cubin"):
        lines.append(f"flashinfer-cubin=={fi['cubin']}")
    lines += [f"{name}=={version}" for name, version in sorted(rel.get("extra_pins", {}).items())]
    return lines + engine_requirements()


def uv_path() -> str:
    """The uv executable: on PATH, or beside this interpreter (a venv's bin/ when PATH lacks it)."""
    return shutil.which("uv") or str(Path(sys.executable).with_name("uv"))


def freeze_command(
    release: str, flavour: str, python_tag: str, machine: str, exclude_newer: str, inputs: Path, output: Path,
    constraints: Path | None = None,
) -> list[str]:
    rel = knowledge.releases()["releases"][release]
    flav = rel["flavours"][flavour]
    argv = [
        uv_path(), "pip", "compile", "--no-config", "--quiet", "--no-header", "--generate-hashes",
        "--python-version", f"{python_tag[2]}.{python_tag[3:]}",
        "--python-platform", uv_platform(rel["glibc_min"], machine),
        "--exclude-newer", exclude_newer,
        "--index-url", PYPI,
    ]  # fmt: skip
    for index in {flav["torch_index"], flav["kernel_index"]} - {PYPI}:
        argv += ["--extra-index-url", index]
    if len({flav["torch_index"], flav["kernel_index"], PYPI}) > 1:
        argv += ["--index-strategy", "unsafe-best-match"]  # torch from its index, the rest from PyPI
    if constraints is not None:
        argv += ["-c", str(constraints)]
    return argv + [str(inputs), "-o", str(output)]


def freeze(
    release: str, flavour: str, python_tag: str, machine: str, exclude_newer: str, out_dir: Path = CLOSURES_DIR,
    constraints: Path | None = None,
) -> Path:
    """Resolve and write one closure file; returns its path. `constraints`: a pins file the resolution must keep.

    Raises:
        DdtreeOpsError: uv is missing, an index is unreachable, or the pins conflict (uv's message).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / file_name(release, flavour, python_tag, machine)
    with tempfile.TemporaryDirectory(prefix="ddtree-closure-") as tmp:
        inputs = Path(tmp) / "inputs.txt"
        inputs.write_text("\n".join(compile_inputs(release, flavour)) + "\n")
        body = Path(tmp) / "closure.txt"
        # Relative paths from the temp dir: uv's "# via -r inputs.txt" notes stay the same on every run.
        argv = freeze_command(
            release, flavour, python_tag, machine, exclude_newer, Path(inputs.name), Path(body.name),
            None if constraints is None else constraints.resolve(),
        )
        if not Path(argv[0]).exists():
            raise DdtreeOpsError("freezing a closure needs uv: pip install uv (it is in ddtree-ops' dev extra)")
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=tmp)
        if proc.returncode != 0:
            raise DdtreeOpsError(
                f"resolving sglang {release} ({flavour}, {python_tag}, {machine}) with the engine's requirements failed:\n"
                + proc.stderr.strip()[-3000:]
            )
        header = [
            f"# The dependency closure of sglang {release} ({flavour}) with the DDTree engine's requirements,",
            f"# for {python_tag} on {uv_platform(knowledge.releases()['releases'][release]['glibc_min'], machine)}.",
            "# Written by `python -m ddtree_ops.provision.closure freeze` (do not edit); the resolver makes it the lock's constraints.",
            f"# release: {release}",
            f"# flavour: {flavour}",
            f"# exclude-newer: {exclude_newer}",
        ]
        target.write_text("\n".join(header) + "\n" + body.read_text())
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddtree_ops.provision.closure", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("freeze", help="resolve and write closure files under knowledge/closures/")
    f.add_argument("--release", required=True)
    f.add_argument("--flavour", required=True)
    f.add_argument("--python", action="append", required=True, help="cp311, cp312, …; repeatable")
    f.add_argument("--machine", action="append", default=None, help="x86_64 (default), aarch64; repeatable")
    f.add_argument("--exclude-newer", required=True, help="ignore files uploaded after this date (YYYY-MM-DD), recorded in the header")
    args = parser.parse_args(argv)
    for python_tag in args.python:
        for machine in args.machine or ["x86_64"]:
            path = freeze(args.release, args.flavour, python_tag, machine, args.exclude_newer)
            closure = parse(path.read_text(), path)
            print(f"{path}: {len(closure.pins)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
