"""Container mode: the Dockerfile rendered from a lock, and (lab) a real CPU image built from the lab's lock."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from ddtree_ops.hosts import probe
from ddtree_ops.provision import container
from ddtree_ops.exceptions import ConfigError
from ddtree_ops.provision.cuda_lock import CudaLock
from ddtree_ops.provision.lock import Lock
from ddtree_ops.provision.resolve import resolve

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"


def cuda_lock(name: str, **kw) -> CudaLock:
    lock = resolve(probe.load_facts(FIXTURES / f"{name}-probe.json"), name, **kw)
    assert isinstance(lock, CudaLock), lock
    return lock


def test_cu130_lock_from_its_indexes_renders_from_nvidia_cuda_with_the_lock_steps_in_order(tmp_path):
    from ddtree_ops.provision.engine_source import engine_wheel_name

    lock = cuda_lock("h200")
    wheel = Path(engine_wheel_name())
    ctx = container.render_dockerfile(lock, tmp_path / "wheelhouse.tar", source="index")
    text = ctx.dockerfile
    assert text.splitlines()[1] == "FROM nvidia/cuda:13.0.1-runtime-ubuntu24.04 AS runtime"
    assert "assert 'cp' + v == 'cp312'" in text
    runs = [l for l in text.splitlines() if l.startswith(f"RUN {container.ENV_DIR}/bin/pip ")]
    staging = container.STAGING
    assert "torch==2.14.1" in runs[0] and "--no-deps" not in runs[0] and f"-c {staging}/constraints.txt" in runs[0]
    assert "--no-deps" in runs[1] and "sglang-kernel==0.4.10" in runs[1]
    assert f"-c {staging}/constraints.txt" in runs[-3] and "sglang==0.5.23" in runs[-3]
    assert runs[-2].endswith(f"--no-deps {staging}/{wheel.name}") and "--no-index" in runs[-2]
    assert runs[-1] == f"RUN {container.ENV_DIR}/bin/pip check && cp {staging}/lock.json {container.ENV_DIR}/lock.json"
    assert f"ADD wheelhouse.tar {staging}/" in text, "the engine wheel and the constraints come in the (small) wheelhouse"
    assert "--index-url https://pypi.org/simple" in runs[0] and "--no-index" not in runs[0]
    assert f'ddtree.lock="{lock.hash}"' in text
    assert set(ctx.files) == {"abi_manifest.py", "wheelhouse.tar"}
    assert container.image_tag(lock) == f"ddtree-engine:{lock.short_hash}"


def test_cu129_lock_uses_the_ubuntu_22_04_image_whose_python_matches():
    lock = cuda_lock("a100-535", release="0.5.6")  # Python 3.10 host
    text = container.render_dockerfile(lock, Path("wheelhouse.tar"), source="index").dockerfile
    assert "FROM nvidia/cuda:12.9.1-runtime-ubuntu22.04" in text and "torch==2.9.1+cu129" in text


def test_python_of_the_base_image_must_match_the_lock():
    lock = dataclasses.replace(cuda_lock("h200"), python_tag="cp311")
    with pytest.raises(ConfigError, match="has Python cp312, the lock is for cp311"):
        container.render_dockerfile(lock, Path("wheelhouse.tar"))


def test_wheelhouse_build_is_offline_and_leaves_the_wheels_in_a_build_stage(tmp_path):
    tar = tmp_path / "wheelhouse.tar"
    tar.write_bytes(b"")
    text = container.render_dockerfile(cuda_lock("h200"), tar).dockerfile
    staging = container.STAGING
    assert f"ADD wheelhouse.tar {staging}/" in text
    runs = [l for l in text.splitlines() if l.startswith(f"RUN {container.ENV_DIR}/bin/pip install")]
    assert len(runs) == 5 and all(f"--no-index --find-links {staging}" in r for r in runs), "offline, in the lock's order"
    assert "download.pytorch.org" not in text and "--index-url" not in text
    stages = [l for l in text.splitlines() if l.startswith("FROM ")]
    assert stages == ["FROM nvidia/cuda:13.0.1-runtime-ubuntu24.04 AS runtime", "FROM runtime AS build", "FROM runtime"]
    final_stage = text.split("\nFROM runtime\n", 1)[1]
    assert "wheelhouse" not in final_stage and f"COPY --from=build {container.ENV_DIR} {container.ENV_DIR}" in final_stage


def test_cpu_flavour_starts_from_the_plain_debian_root_filesystem_not_the_lab_host_image(tmp_path):
    from ddtree_ops.lab.image import LAB_IMAGE, LAB_ROOTFS_IMAGE

    reference = Lock("reference", "cp311", "manylinux_2_28_x86_64", ("ddtree-engine==0.1.0",), "e" * 64)
    assert container.base_image(reference) == LAB_ROOTFS_IMAGE != LAB_IMAGE
    assert container.base_python_version() == "3.11"


@pytest.mark.lab
@pytest.mark.slow
def test_cpu_flavour_builds_a_real_image_from_the_lab_lock():
    from ddtree_ops.config import Project
    from ddtree_ops.lab.image import ensure_image
    from ddtree_ops.provision.lock import resolve_lock
    from ddtree_ops.provision.wheelhouse import ensure_wheelhouse

    project = Project.model_validate(
        {
            "hosts": [{"name": "lab-1", "address": "127.0.0.1"}],
            "engine": {"backend": "reference", "target": "lab", "draft": "lab", "install": {"mode": "container"}},
            "services": [{"name": "baseline", "algorithm": "dflash", "port": 30000}],
        }
    )
    ensure_image()  # builds the Debian root filesystem the CPU flavour starts from (no registry needed)
    lock = resolve_lock(project, project.hosts[0], {"python_version": "3.11.2", "architecture": "x86_64"})
    ctx = container.render_dockerfile(lock, ensure_wheelhouse(lock))
    lines: list[str] = []
    tag = container.build_image(lock, ctx, progress=lines.append)
    assert tag == f"ddtree-engine:{lock.short_hash}" and any("Step" in l for l in lines)
    # The image's env runs the engine, and the manifest made at build time passed.
    out = subprocess.run(["docker", "run", "--rm", tag, "serve", "--help"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "--port" in out.stdout, out.stderr
    manifest = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "cat", tag, f"{container.ENV_DIR}/abi-manifest.json"], capture_output=True, text=True, timeout=120
    )
    assert '"ok": true' in manifest.stdout
    # The service runs from the image with the flags a container-mode unit gives it, and answers /health.
    import httpx
    import time

    from ddtree_ops.deploy.units import container_run_args

    name = f"ddtree-image-test-{lock.short_hash}"
    port = 38123
    flags = container_run_args(project.services[0], project.hosts[0], project.engine, ["PYTHONUNBUFFERED"])
    serve = ["serve", "--target", "lab", "--draft", "lab", "--host", "127.0.0.1", "--port", str(port)]
    argv = ["docker", "run", "--rm", "--name", name, *flags, tag, *serve]
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        status = None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code
            except httpx.HTTPError:
                status = None
            if status == 200:
                break
            time.sleep(1)
        assert status == 200, server.stdout.read() if server.poll() is not None else "no /health 200 within 240 s"
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions", json={"model": "lab", "prompt": "2+2=", "max_tokens": 4, "temperature": 0}, timeout=60
        )
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        server.wait(timeout=60)
