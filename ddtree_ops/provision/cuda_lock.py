"""The sglang backend's lock (CudaLock) and its install steps: torch first, the kernel wheels without
their dependencies, then SGLang under the frozen constraints. `resolve.resolve` makes one from a
host's probe; this module is what the lock does with itself (download, install, check, show).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import knowledge
from ..exceptions import ConfigError
from . import install, wheelhouse
from .lock import EngineLock


@dataclass(frozen=True)
class InstallStep:
    """One `pip install` the builder runs, in order."""

    description: str
    requirements: tuple[str, ...]
    index_url: str
    extra_index_urls: tuple[str, ...] = ()
    no_deps: bool = False
    use_constraints: bool = False

    def pip_args(self, constraints_path: str = "constraints.txt") -> list[str]:
        args = ["install", "--index-url", self.index_url]
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        if self.no_deps:
            args.append("--no-deps")
        if self.use_constraints:
            args += ["-c", constraints_path]
        return args + list(self.requirements)


@dataclass(frozen=True)
class CudaLock(EngineLock):
    """An sglang-backend lock: everything that decides what an sglang env contains; its hash names the env."""

    backend: str
    sglang_version: str
    cuda_flavour: str  # "cu130"
    cuda_version: str  # "13.0"
    python_tag: str  # "cp312"
    platform: str  # wheel platform tag of the host, e.g. "manylinux_2_34_x86_64"
    pins: tuple[str, ...]  # "name==version", sorted: the frozen constraints file
    steps: tuple[InstallStep, ...]
    engine_source: str = ""
    # Not part of the env's identity (two hosts with different GPUs can share an env):
    driver_mode: str = field(default="native", compare=False)  # native | minor-version-compat
    gpu_archs: tuple[str, ...] = field(default=(), compare=False)
    attention_backend: str | None = field(default=None, compare=False)
    warnings: tuple[str, ...] = field(default=(), compare=False)
    # Why this lock can be planned but not installed (e.g. the engine conflicts with the release's pins).
    blockers: tuple[str, ...] = field(default=(), compare=False)

    @property
    def hash(self) -> str:
        """sha256 over the pins, the install steps (order, indexes, flags), python, platform, engine source."""
        identity = {
            "backend": self.backend,
            "sglang": self.sglang_version,
            "cuda_flavour": self.cuda_flavour,
            "python": self.python_tag,
            "platform": self.platform,
            "pins": sorted(self.pins),
            "steps": [asdict(s) for s in self.steps],
            "engine_source": self.engine_source,
        }
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()

    @property
    def requirements(self) -> tuple[str, ...]:
        """Every pinned package (what the manifest checks the env against)."""
        return self.pins

    def requirements_text(self) -> str:
        """The frozen constraints file."""
        return "".join(f"{pin}\n" for pin in sorted(self.pins))

    def pin(self, name: str) -> str | None:
        for line in self.pins:
            pin_name, _, version = line.partition("==")
            if pin_name == name:
                return version
        return None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["pins"] = list(self.pins)
        d["steps"] = [asdict(s) | {"pip_args": s.pip_args()} for s in self.steps]
        d["hash"] = self.hash
        d["short_hash"] = self.short_hash
        return d

    # --- the EngineLock interface: what sglang envs do differently ---------------------------

    def ensure_wheelhouse(self, engine_dir: Path, source: str) -> Path:
        return wheelhouse.ensure_cuda_wheelhouse(self, engine_dir, source)

    def install_commands(self, staging: str, *, source: str, engine_wheel: str | None) -> list[list[str]]:
        return install.step_install_commands(self.steps, staging, source=source, engine_wheel=engine_wheel)

    def image_build_manifest_args(self) -> list[str]:
        # Without a GPU at build time the kernels cannot load (no libcuda.so.1): check their ELF needs, not their import.
        return []

    @property
    def image_flavour(self) -> str:
        return self.cuda_flavour

    def image_base(self) -> str | None:
        """nvidia/cuda of the lock's CUDA, or an lmsysorg/sglang tag that matches the lock exactly.

        Raises:
            ConfigError: no base image is known for the lock's CUDA flavour.
        """
        release = knowledge.releases()["releases"].get(self.sglang_version, {})
        if release.get("lmsysorg_image"):
            return release["lmsysorg_image"]
        bases = knowledge.cuda()["container_bases"]
        if self.cuda_flavour not in bases:
            raise ConfigError(f"no container base image is known for CUDA flavour {self.cuda_flavour}: add it to knowledge/cuda.yaml")
        return bases[self.cuda_flavour]["cuda_image"]

    def plan_rows(self) -> dict[str, str]:
        return {
            "backend": "sglang " + self.sglang_version,
            "CUDA flavour": f"{self.cuda_flavour} ({self.driver_mode})",
            "torch": self.pin("torch") or "",
            "kernel": self.pin("sglang-kernel") or self.pin("sgl-kernel") or "",
            "flashinfer": self.pin("flashinfer-python") or "",
            "python": self.python_tag,
            "GPU archs": ", ".join(self.gpu_archs),
            "attention": self.attention_backend or "",
            "constraints": f"{len(self.pins)} pins",
            "env": self.short_hash if not self.blockers else f"{self.short_hash} (not installable)",
        }

    def describe(self) -> str:
        return f"env {self.short_hash} (sglang {self.sglang_version}, {self.cuda_flavour}, {self.driver_mode})"
