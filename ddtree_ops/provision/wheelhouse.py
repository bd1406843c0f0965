"""The wheelhouse: every wheel a lock names, built/downloaded on the control node so hosts need no network.

Layout under the cache dir (`~/.cache/ddtree-ops/wheelhouse/`):
    resolved/<inputs-hash>.txt   pinned requirements resolved from the engine's declared dependencies
    downloads/<inputs-hash>/     the wheels that resolution downloaded (reused by every lock)
    <lock short hash>/           wheelhouse.tar (wheels + requirements.txt + lock.json), .complete
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from ..exceptions import DdtreeOpsError
from ..state import cache_dir
from . import closure as closures
from .engine_source import ENGINE_NAME, engine_metadata, engine_source_digest, engine_source_dir

log = logging.getLogger(__name__)

# The CPU build of torch for the reference backend. PyPI's Linux torch is the CUDA build (GBs);
# set $DDTREE_TORCH_INDEX_URL (e.g. https://download.pytorch.org/whl/cpu) where no local copy exists.
REFERENCE_PINS = ("torch==2.13.0",)
TORCH_INDEX_ENV = "DDTREE_TORCH_INDEX_URL"
TARBALL = "wheelhouse.tar"
COMPLETE = ".complete"


_WHEEL_RE = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


def pin_of_wheel(filename: str) -> str:
    """`name==version` (name normalised as PEP 503 says) from a wheel's file name."""
    m = _WHEEL_RE.match(filename)
    if not m:
        raise ValueError(f"not a wheel file name: {filename!r}")
    name = re.sub(r"[-_.]+", "-", m.group("name")).lower()
    return f"{name}=={m.group('version')}"


def _target_args(python_tag: str, platform: str) -> list[str]:
    version = f"{python_tag[2]}.{python_tag[3:]}"
    args = ["--only-binary=:all:", "--python-version", version, "--implementation", "cp", "--abi", python_tag]
    for plat in compatible_platforms(platform):
        args += ["--platform", plat]
    if os.environ.get(TORCH_INDEX_ENV):
        args += ["--extra-index-url", os.environ[TORCH_INDEX_ENV]]
    return args


def compatible_platforms(platform: str) -> list[str]:
    """`manylinux_2_28_x86_64` → it and every older manylinux tag a host with that glibc also runs.

    pip does not widen an explicit --platform, so the list is spelled out.
    """
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not m:
        return [platform]
    minor, arch = int(m.group(1)), m.group(2)
    tags = [f"manylinux_2_{v}_{arch}" for v in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{name}_{arch}" for v, name in legacy.items() if v <= minor]
    return tags


def _pip(args: list[str], what: str) -> None:
    log.info("wheelhouse: %s", what)
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise DdtreeOpsError(f"wheelhouse: {what} failed (pip exit {proc.returncode}):\n{tail}")


def _root() -> Path:
    return cache_dir() / "wheelhouse"


def _inputs_hash(python_tag: str, platform: str, dependencies: list[str]) -> str:
    doc = json.dumps({"deps": sorted(dependencies), "pins": REFERENCE_PINS, "py": python_tag, "plat": platform})
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def resolve_requirements(python_tag: str, platform: str, engine_dir: Path) -> list[str]:
    """Pin the engine and every dependency to exact versions for one Python and platform.

    Resolution runs `pip download` once per set of inputs (the engine's declared dependencies,
    the torch pin, python tag, platform) and is cached; the engine itself is pinned to its version.
    """
    version, dependencies = engine_metadata(engine_dir)
    key = _inputs_hash(python_tag, platform, dependencies)
    resolved = _root() / "resolved" / f"{key}.txt"
    if not resolved.exists():
        downloads = _root() / "downloads" / key
        downloads.mkdir(parents=True, exist_ok=True)
        _pip(
            ["download", "--dest", str(downloads), *_target_args(python_tag, platform), *dependencies, *REFERENCE_PINS],
            f"resolving the engine's dependencies for {python_tag} {platform}",
        )
        pins = sorted(pin_of_wheel(p.name) for p in downloads.glob("*.whl"))
        resolved.parent.mkdir(parents=True, exist_ok=True)
        tmp = resolved.with_suffix(".part")
        tmp.write_text("".join(f"{p}\n" for p in pins))
        tmp.replace(resolved)
    pins = [line.strip() for line in resolved.read_text().splitlines() if line.strip()]
    return sorted(pins + [f"{ENGINE_NAME}=={version}"])


def _build_engine_wheel(engine_dir: Path, out: Path) -> Path:
    # Build from a copy: an in-tree build would leave build/ and *.egg-info in the engine's sources.
    with tempfile.TemporaryDirectory(prefix="ddtree-engine-src-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(
            engine_dir, src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "build", "dist", "*.egg-info")
        )
        args = ["wheel", "--no-deps", "-w", str(out), str(src)]
        if importlib.util.find_spec("setuptools") is not None:
            # Present: build offline with it, no isolated env to download.
            args.insert(1, "--no-build-isolation")
        _pip(args, f"building the engine wheel from {engine_dir}")
    wheels = sorted(out.glob("ddtree_engine-*.whl"))
    if not wheels:
        raise DdtreeOpsError(f"building the engine wheel from {engine_dir} produced no wheel")
    return wheels[-1]


def wheelhouse_dir(lock) -> Path:
    return _root() / lock.short_hash


def ensure_wheelhouse(lock, engine_dir: Path | None = None, source: str = "wheelhouse") -> Path:
    """The tarball holding every wheel of `lock`, built once per lock and cached.

    What goes in is the lock's own business (`lock.ensure_wheelhouse`: `ensure_reference_wheelhouse`
    or `ensure_cuda_wheelhouse`); this checks first that the engine sources are the ones locked.

    Returns the path of wheelhouse.tar (wheels, requirements.txt or constraints.txt, lock.json at its top level).
    For an sglang lock with `source="index"` it holds only the engine wheel, the constraints and the lock.
    Raises:
        DdtreeOpsError: pip could not build or download something (with pip's last lines).
    """
    engine_dir = engine_dir or engine_source_dir()
    if lock.engine_source and engine_source_digest(engine_dir) != lock.engine_source:
        raise DdtreeOpsError("the engine sources changed while provisioning; run provision again")
    return lock.ensure_wheelhouse(engine_dir, source)


def ensure_reference_wheelhouse(lock, engine_dir: Path) -> Path:
    """A reference lock's wheelhouse: the engine wheel, every pinned wheel, requirements.txt, lock.json.

    Returns:
        the path of wheelhouse.tar.
    """
    final = wheelhouse_dir(lock)
    if (final / COMPLETE).exists():
        return final / TARBALL

    def fill(wheels: Path) -> None:
        wanted = {line for line in lock.requirements if not line.startswith(f"{ENGINE_NAME}==")}
        # Reuse what resolution downloaded; download (exact pins, no resolution) only what is missing.
        for downloads in (_root() / "downloads").glob("*"):
            for wheel in downloads.glob("*.whl"):
                pin = pin_of_wheel(wheel.name)
                if pin in wanted and not (wheels / wheel.name).exists():
                    shutil.copy2(wheel, wheels / wheel.name)
        have = {pin_of_wheel(w.name) for w in wheels.glob("*.whl")}
        missing = sorted(wanted - have)
        if missing:
            _pip(
                ["download", "--no-deps", "--dest", str(wheels), *_target_args(lock.python_tag, lock.platform), *missing],
                f"downloading {len(missing)} pinned wheel(s)",
            )
        (wheels / "requirements.txt").write_text(lock.requirements_text())

    return _assemble(lock, final, engine_dir, fill)


def _assemble(lock, final: Path, engine_dir: Path, fill) -> Path:
    """Build `final`/wheelhouse.tar in a staging dir: the engine wheel, what `fill(wheels_dir)` adds, lock.json.

    The directory only appears (atomically) once complete, so an interrupted build is never reused.
    """
    _root().mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{lock.short_hash}.", dir=_root()))
    try:
        wheels = staging / "wheels"
        wheels.mkdir()
        _build_engine_wheel(engine_dir, wheels)
        fill(wheels)
        (wheels / "lock.json").write_text(json.dumps(lock.to_dict(), indent=2) + "\n")
        with tarfile.open(staging / TARBALL, "w") as tar:
            for path in sorted(wheels.iterdir()):
                tar.add(path, arcname=path.name)
        shutil.rmtree(wheels)
        (staging / COMPLETE).write_text(lock.hash + "\n")
        if final.exists():
            shutil.rmtree(final)
        staging.replace(final)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return final / TARBALL


def _index_args(lock) -> list[str]:
    urls = list(dict.fromkeys(url for step in lock.steps for url in (step.index_url, *step.extra_index_urls)))
    args = ["--index-url", urls[0]]
    for url in urls[1:]:
        args += ["--extra-index-url", url]
    return args


def ensure_cuda_wheelhouse(lock, engine_dir: Path, source: str) -> Path:
    """An sglang lock's wheelhouse: the engine wheel, constraints.txt, lock.json and (source wheelhouse)
    every wheel of the env for the host's Python and platform, checked against the closure's hashes.

    Returns:
        the path of wheelhouse.tar.
    """
    final = _root() / f"{lock.short_hash}-{source}"
    if (final / COMPLETE).exists():
        return final / TARBALL

    def fill(wheels: Path) -> None:
        if source == "wheelhouse":
            target = [*_target_args(lock.python_tag, lock.platform), *_index_args(lock)]
            frozen = closures.for_lock(lock)
            rest = list(lock.pins)
            if frozen is not None:
                # Every wheel checked against the hash frozen with the closure.
                _pip(["download", "--no-deps", "--require-hashes", "--dest", str(wheels), *target, "-r", str(frozen.path)],
                     f"downloading the {len(frozen.pins)} wheels of {frozen.path.name}")
                rest = [pin for pin in lock.pins if closures.normalise(pin.split("==")[0]) not in frozen.pins]
            if rest:
                _pip(["download", "--no-deps", "--dest", str(wheels), *target, *rest], f"downloading {len(rest)} pinned wheel(s)")
        (wheels / "constraints.txt").write_text(lock.requirements_text())

    return _assemble(lock, final, engine_dir, fill)
