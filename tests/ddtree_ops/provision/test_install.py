"""The pip commands a host runs to build an env from its lock, in order."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtree_ops.hosts import probe
from ddtree_ops.provision.install import install_commands
from ddtree_ops.provision.lock import Lock
from ddtree_ops.provision.cuda_lock import CudaLock
from ddtree_ops.provision.resolve import resolve

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"
W = "/opt/ddtree/wheelhouse/0123456789abcdef"
ENGINE = "ddtree_engine-0.1.0-py3-none-any.whl"


def h200_lock() -> CudaLock:
    lock = resolve(probe.load_facts(FIXTURES / "h200-probe.json"), "h200")
    assert isinstance(lock, CudaLock)
    return lock


def pkgs(command: list[str]) -> list[str]:
    return [a for a in command if "==" in a and not a.startswith("-")]


def test_a_reference_lock_is_one_offline_install_of_its_requirements():
    lock = Lock("reference", "cp311", "manylinux_2_28_x86_64", ("torch==2.13.0",), "digest")
    assert install_commands(lock, W) == [
        ["install", "--no-cache-dir", "--disable-pip-version-check", "--no-index", "--find-links", W, "--requirement", f"{W}/requirements.txt"]
    ]


def test_an_sglang_lock_from_the_wheelhouse_follows_sglangs_order_offline():
    commands = install_commands(h200_lock(), W, engine_wheel=ENGINE)
    assert all(c[3:6] == ["--no-index", "--find-links", W] for c in commands), "air-gapped: no index, every step"
    torch, kernels, jit_cache, sglang, engine = commands
    assert pkgs(torch) == ["torch==2.14.1", "torchvision==0.29.1", "torchaudio==2.11.0"] and "--no-deps" not in torch
    assert "-c" in torch, "torch's own dependencies (the CUDA wheels) come from the frozen closure too"
    assert "--no-deps" in kernels and pkgs(kernels) == ["sglang-kernel==0.4.10", "flashinfer-python==0.7.2"]
    assert "--no-deps" in jit_cache and pkgs(jit_cache) == ["flashinfer-jit-cache==0.7.2+cu130"]
    assert sglang[sglang.index("-c") + 1] == f"{W}/constraints.txt" and "sglang==0.5.23" in sglang
    assert engine[-2:] == ["--no-deps", f"{W}/{ENGINE}"]


def test_an_sglang_lock_from_its_indexes_downloads_on_the_host():
    commands = install_commands(h200_lock(), W, source="index", engine_wheel=ENGINE)
    indexes = [c[c.index("--index-url") + 1] for c in commands[:-1]]
    assert indexes == ["https://pypi.org/simple", "https://pypi.org/simple", "https://flashinfer.ai/whl/cu130", "https://pypi.org/simple"]
    assert commands[-1][-2:] == ["--no-deps", f"{W}/{ENGINE}"] and "--no-index" in commands[-1]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="unknown install source 'ftp'"):
        install_commands(h200_lock(), W, source="ftp", engine_wheel=ENGINE)
    with pytest.raises(ValueError, match="engine wheel last"):
        install_commands(h200_lock(), W)
