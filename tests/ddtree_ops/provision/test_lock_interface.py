"""One lock interface: the package treats every lock through `EngineLock`, so a new kind of lock plugs in
by implementing it — install commands, the container image, the plan table and doctor follow without
an `isinstance` or a backend name anywhere else."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from ddtree_ops.config import parse_project
from ddtree_ops.health import doctor
from ddtree_ops.hosts import probe
from ddtree_ops.provision import container, install, plan
from ddtree_ops.provision.cuda_lock import CudaLock
from ddtree_ops.provision.lock import EngineLock, Lock
from ddtree_ops.provision.resolve import resolve

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"


@dataclass(frozen=True)
class RocmLock(EngineLock):
    """A made-up third backend: only the interface, nothing registered anywhere else."""

    backend: str = "rocm"
    python_tag: str = "cp312"
    platform: str = "manylinux_2_28_x86_64"
    requirements: tuple[str, ...] = ("torch==2.9.0+rocm6.4", "ddtree-engine==0.1.0")
    engine_source: str = "e" * 64
    warnings: tuple[str, ...] = ("no ROCm kernels for the tree yet",)

    @property
    def hash(self) -> str:
        return "f" * 64

    def requirements_text(self) -> str:
        return "\n".join(self.requirements) + "\n"

    def to_dict(self) -> dict:
        return {"backend": self.backend, "hash": self.hash}

    def ensure_wheelhouse(self, engine_dir, source):
        raise AssertionError("not called here")

    def install_commands(self, staging, *, source, engine_wheel):
        return [["install", "--find-links", staging, "-r", f"{staging}/rocm.txt"]]

    def image_build_manifest_args(self) -> list[str]:
        return ["--require", "torch"]

    @property
    def image_flavour(self) -> str:
        return "rocm64"

    def image_base(self) -> str | None:
        return "rocm/dev-ubuntu-24.04:6.4"

    def plan_rows(self) -> dict[str, str]:
        return {"backend": "rocm 6.4", "env": self.short_hash}


def test_a_new_lock_kind_plugs_in_through_the_interface_alone(tmp_path):
    lock = RocmLock()
    assert install.install_commands(lock, "/stage") == [["install", "--find-links", "/stage", "-r", "/stage/rocm.txt"]]
    assert container.base_image(lock) == "rocm/dev-ubuntu-24.04:6.4"
    assert container.image_tag(lock) == "ddtree-engine:ffffffffffffffff"
    rendered = container.render_dockerfile(lock, tmp_path / "wheelhouse.tar")
    assert "FROM rocm/dev-ubuntu-24.04:6.4" in rendered.dockerfile and "--require torch" in rendered.dockerfile
    table = plan.render_side_by_side([plan.PlanResult("gpu1", "test", None, lock, None)])
    assert "rocm 6.4" in table and "gpu1: warning: no ROCm kernels for the tree yet" in table
    assert lock.pinned() == {"torch": "2.9.0+rocm6.4", "ddtree-engine": "0.1.0"}
    assert lock.describe() == "env ffffffffffffffff"


def test_an_incomplete_lock_cannot_be_made():
    @dataclass(frozen=True)
    class NoInstall(RocmLock):
        install_commands = EngineLock.install_commands  # the abstract one again

    with pytest.raises(TypeError, match="install_commands"):
        NoInstall()


def test_the_two_real_locks_answer_the_interface_their_own_way():
    cuda = resolve(probe.load_facts(FIXTURES / "h200-probe.json"), "h200")
    assert isinstance(cuda, CudaLock)
    reference = Lock("reference", "cp311", "manylinux_2_28_x86_64", ("numpy==2.4.6", "ddtree-engine==0.1.0"), "e" * 64)
    assert reference.install_source("index") == "wheelhouse" and cuda.install_source("index") == "index"
    assert reference.image_flavour == "cpu" and reference.image_base() is None
    assert cuda.image_flavour == "cu130" and cuda.image_base().startswith("nvidia/cuda:13.0")
    assert reference.image_build_manifest_args() == ["--require", "ddtree_engine"] and cuda.image_build_manifest_args() == []
    assert reference.warns_on_extra_packages and not cuda.warns_on_extra_packages
    assert cuda.describe() == f"env {cuda.short_hash} (sglang 0.5.23, cu130, native)"
    assert list(reference.plan_rows()) == ["backend", "python", "platform", "env"]
    assert cuda.plan_rows()["CUDA flavour"] == "cu130 (native)"
    assert reference.manifest_args()[-2:] == ["--expect-packages", '{"ddtree-engine": "0.1.0", "numpy": "2.4.6"}']
    with pytest.raises(ValueError, match="pass engine_wheel"):
        cuda.install_commands("/stage", source="wheelhouse", engine_wheel=None)


def test_doctor_describes_any_lock_through_the_interface():
    project = parse_project(
        {"hosts": [{"name": "h200", "address": "10.0.0.1"}], "engine": {"backend": "sglang", "target": "/m/t", "draft": "/m/d"},
         "services": [{"name": "tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "port": 30000}]},
        "test",
    )  # fmt: skip
    lock, check = doctor.resolve_for_doctor(project, project.host("h200"), probe.load_facts(FIXTURES / "h200-probe.json"))
    assert lock is not None and check.detail.startswith(f"env {lock.short_hash} (sglang 0.5.23, cu130, native)")
