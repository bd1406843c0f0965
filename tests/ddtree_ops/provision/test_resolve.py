"""CUDA-ABI resolution of recorded host probes: the right lock, or the right refusal with its fix."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ddtree_ops import knowledge
from ddtree_ops.hosts import probe
from ddtree_ops.exceptions import ConfigError
from ddtree_ops.provision.cuda_lock import CudaLock
from ddtree_ops.provision.resolve import Refusal, resolve

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"


def facts(name: str) -> probe.HostFacts:
    return probe.load_facts(FIXTURES / f"{name}-probe.json")


def lock_of(name: str, **kw) -> CudaLock:
    result = resolve(facts(name), name, **kw)
    assert isinstance(result, CudaLock), result
    return result


def refusal_of(name: str, **kw) -> Refusal:
    result = resolve(facts(name), name, **kw)
    assert isinstance(result, Refusal), result
    return result


# ---- sglang 0.5.23 (the default release: CUDA 13 only) ----------------------------------------


def test_h200_on_580_gets_the_cu130_lock():
    lock = lock_of("h200")
    assert (lock.sglang_version, lock.cuda_flavour, lock.driver_mode) == ("0.5.23", "cu130", "native")
    assert lock.pin("torch") == "2.14.1" and lock.pin("sglang-kernel") == "0.4.10" and lock.pin("flashinfer-python") == "0.7.2"
    assert lock.python_tag == "cp312" and lock.platform == "manylinux_2_34_x86_64"
    assert lock.attention_backend == "fa3" and lock.gpu_archs == ("sm_90",)
    assert lock.warnings == ()


def test_install_order_torch_then_kernels_no_deps_then_constraints():
    lock = lock_of("h200")
    first, kernels, *rest = lock.steps
    assert [r.split("==")[0] for r in first.requirements] == ["torch", "torchvision", "torchaudio"] and not first.no_deps
    assert kernels.no_deps and "sglang-kernel==0.4.10" in kernels.requirements
    last = rest[-1]
    assert last.use_constraints and "sglang==0.5.23" in last.requirements
    assert last.pip_args()[-len(last.requirements) - 2 : -len(last.requirements)] == ["-c", "constraints.txt"]
    # the constraints file freezes every pin, torch and the kernels included
    text = lock.requirements_text()
    assert "torch==2.14.1\n" in text and "sglang-kernel==0.4.10\n" in text and "soundfile==0.13.1\n" in text


def test_rtx6000_on_580_gets_cu130_with_flashinfer_backend():
    lock = lock_of("rtx6000-580")
    assert (lock.cuda_flavour, lock.driver_mode, lock.attention_backend) == ("cu130", "native", "flashinfer")
    assert lock.gpu_archs == ("sm_120",)


@pytest.mark.parametrize("name, driver", [("rtx6000-570", "570.153.02"), ("rtx6000-575", "575.57.08")])
def test_rtx6000_below_580_is_refused_for_0_5_23(name, driver):
    refusal = refusal_of(name)
    assert refusal.codes == ("driver-too-old",)
    assert refusal.message == (
        f"sglang 0.5.23 ships kernel wheels for cu130 only: cu130 (CUDA 13.0) needs a driver >= 580.65.06; "
        f"host {name} has driver {driver} — upgrade the driver"
    )


def test_old_535_driver_is_refused_with_every_reason():
    refusal = refusal_of("a100-535")
    assert refusal.codes == ("python-version", "driver-too-old")
    assert "Python 3.11–3.13; host a100-535's python3 is 3.10.12" in refusal.message
    assert "host a100-535 has driver 535.183.01 — upgrade the driver" in refusal.message


def test_host_without_gpu_is_refused():
    refusal = refusal_of("cpu-only")
    assert refusal.codes == ("no-driver",)
    assert "use engine.backend: reference" in refusal.message and ">= 580.65.06 for sglang 0.5.23" in refusal.message


def test_nvml_mismatch_is_refused_with_reboot_fix():
    refusal = refusal_of("nvml-mismatch")
    assert refusal.codes == ("nvml-mismatch",)
    assert "kernel module 570.133.20 is loaded" in refusal.message and "reboot the host" in refusal.message


def test_blackwell_on_a_pre_570_driver_names_the_gpu_and_the_fix():
    # What an operator sees when planning an upgrade path with DDTREE_DRIVER_VERSION=535.183.01.
    old = dataclasses.replace(facts("rtx6000-570"), driver_version="535.183.01")
    refusal = resolve(old, "rtx6000-570")
    assert isinstance(refusal, Refusal) and refusal.codes == ("driver-too-old-for-gpu",)
    assert refusal.message == (
        "GPU 0 (and 7 more of the same model) is an RTX PRO 6000 Blackwell Server Edition (sm_120), which needs "
        "CUDA >= 12.8 and a driver >= 570.26; host rtx6000-570 has driver 535.183.01 — upgrade the driver"
    )


# ---- sglang 0.5.6 (torch 2.9.1; cu129 and cu130 lanes) -------------------------------------------


def test_535_gets_cu129_through_minor_version_compatibility():
    lock = lock_of("a100-535", release="0.5.6")
    assert (lock.cuda_flavour, lock.driver_mode) == ("cu129", "minor-version-compat")
    assert lock.pin("torch") == "2.9.1+cu129" and lock.pin("sgl-kernel") == "0.3.18.post2"
    assert lock.warnings == (
        "sglang 0.5.6 ships kernel wheels for cu129 and cu130 only; host a100-535's driver 535.183.01 supports CUDA 12.x "
        "only through minor-version compatibility — cu129 is chosen, with PTX JIT unavailable (every kernel needs native "
        "code for sm_80); a driver >= 575.51.03 lifts this",
    )


def test_rtx6000_570_on_0_5_6_warns_about_compat_and_the_flashinfer_toolkit():
    lock = lock_of("rtx6000-570", release="0.5.6")
    assert (lock.cuda_flavour, lock.driver_mode) == ("cu129", "minor-version-compat")
    assert any("needs a CUDA >= 12.9 toolkit for sm_12x; host rtx6000-570 has nvcc 12.8" in w for w in lock.warnings)
    assert lock.pin("flashinfer-jit-cache") == "0.5.3+cu129"


def test_rtx6000_575_on_0_5_6_is_native_cu129():
    lock = lock_of("rtx6000-575", release="0.5.6")
    assert (lock.cuda_flavour, lock.driver_mode) == ("cu129", "native")


def test_rtx6000_580_with_a_12_9_toolkit_has_no_flashinfer_warning():
    assert lock_of("rtx6000-580", release="0.5.6").warnings == ()


# ---- hashes, attention backends, bad input -------------------------------------------------------


def test_same_env_same_hash_across_gpu_models_and_different_for_different_pins():
    h200, rtx = lock_of("h200"), lock_of("rtx6000-580")
    assert h200.hash == rtx.hash  # same python, release and flavour: one env serves both
    assert lock_of("h200", release="0.5.6").hash != h200.hash
    assert lock_of("h200", engine_source="abc").hash != h200.hash


def test_fa3_is_refused_on_blackwell_and_allowed_on_hopper():
    refusal = refusal_of("rtx6000-580", attention_backend="fa3")
    assert refusal.codes == ("attention-backend",)
    assert "FA3 covers sm_80–sm_90 only" in refusal.message and "flashinfer" in refusal.message
    assert lock_of("h200", attention_backend="fa3").attention_backend == "fa3"


def test_planning_without_a_gpu_needs_an_arch_and_a_driver():
    cpu = dataclasses.replace(facts("cpu-only"), driver_version="580.65.06", python_version="3.12.3")
    assert isinstance(resolve(cpu, "builder"), Refusal)
    lock = resolve(cpu, "builder", target_archs=("sm_120",))
    assert isinstance(lock, CudaLock) and lock.cuda_flavour == "cu130" and lock.attention_backend == "flashinfer"


def test_unknown_release_and_arch_are_usage_errors():
    with pytest.raises(ConfigError, match="sglang 0.4.0 is not a release"):
        resolve(facts("h200"), "h200", release="0.4.0")
    with pytest.raises(ConfigError, match="--gpu-arch sm_999"):
        resolve(facts("h200"), "h200", target_archs=("sm_999",))


def test_low_disk_and_old_glibc_are_refused():
    f = dataclasses.replace(facts("h200"), disk_free_bytes=5 * 2**30, glibc="2.31", os_id="ubuntu", os_version="20.04")
    refusal = resolve(f, "old")
    assert isinstance(refusal, Refusal) and set(refusal.codes) == {"disk", "glibc"}
    assert "glibc >= 2.34; host old has 2.31 (ubuntu 20.04)" in refusal.message


def test_knowledge_files_name_their_sources():
    for name in ("sglang_releases", "cuda"):
        text = (knowledge.KNOWLEDGE_DIR / f"{name}.yaml").read_text()
        assert text.count("#") > 20, name
    rel = knowledge.releases()["releases"]
    assert set(rel["0.5.23"]["flavours"]) == {"cu130"} and "cu126" not in rel["0.5.6"]["flavours"]
    assert rel["0.5.6"]["torch"].startswith("2.9")


def test_the_flashinfer_jit_cache_can_be_left_out_with_a_warning():
    lock = resolve(facts("h200"), "h200", flashinfer_jit_cache=False)
    assert lock.pin("flashinfer-jit-cache") is None and lock.hash != lock_of("h200").hash
    assert all("flashinfer.ai" not in step.index_url for step in lock.steps)
    assert any("precompiled JIT cache is left out" in w for w in lock.warnings)
