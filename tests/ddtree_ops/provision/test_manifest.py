"""The ABI manifest's checks against real artefacts: shared objects built here with gcc, real imports.

Nothing is a string made up to look like a loader error: each failure below is produced by the
dynamic loader or the import system on objects whose ELF headers say what the test claims.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# No ddtree_ops imports at module level: this file also runs on GPU machines that only have torch and pytest.
MANIFEST_SCRIPT = Path(__file__).resolve().parents[3] / "ddtree_ops" / "host_scripts" / "abi_manifest.py"

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the test artefacts")

sys.path.insert(0, str(MANIFEST_SCRIPT.parent))
abi = importlib.import_module("abi_manifest")
sys.path.pop(0)

FIXTURE_MANIFEST = Path(__file__).resolve().parents[2] / "fixtures" / "manifests" / "h200-manifest.json"
MISSING_C10_SYMBOL = "_ZN3c1027ddtreeSymbolTorchNeverHadEv"  # c10::ddtreeSymbolTorchNeverHad()


def gcc(*args: str) -> None:
    subprocess.run(["gcc", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory) -> dict[str, Path]:
    """Stub CUDA runtimes (sonames libcudart.so.12 / .13) and extensions linked against them."""
    root = tmp_path_factory.mktemp("abi")
    (root / "cuda12").mkdir()
    (root / "cuda13").mkdir()
    stub = root / "stub.c"
    stub.write_text("int cudaRuntimeGetVersion(int *v) { *v = 12090; return 0; }\n")
    gcc("-shared", "-fPIC", "-Wl,-soname,libcudart.so.12", "-o", str(root / "cuda12" / "libcudart.so.12"), str(stub))
    gcc("-shared", "-fPIC", "-Wl,-soname,libcudart.so.13", "-o", str(root / "cuda13" / "libcudart.so.13"), str(stub))
    ext = root / "ext.c"
    ext.write_text("int cudaRuntimeGetVersion(int *v);\nint ext_cuda(void) { int v = 0; cudaRuntimeGetVersion(&v); return v; }\n")

    out = {}
    # An extension built for CUDA 12, no RUNPATH: what a cu12 sgl_kernel wheel looks like.
    out["cu12_ext"] = root / "cu12_ext.so"
    gcc("-shared", "-fPIC", "-Wl,--no-as-needed", "-o", str(out["cu12_ext"]), str(ext), f"-L{root / 'cuda12'}", "-l:libcudart.so.12")
    # The same, carrying its runtime next to it through $ORIGIN (how torch finds nvidia/*/lib).
    pkg = root / "withrunpath"
    (pkg / "lib").mkdir(parents=True)
    shutil.copy(root / "cuda12" / "libcudart.so.12", pkg / "lib")
    out["cu12_runpath_ext"] = pkg / "ext.so"
    gcc(
        "-shared", "-fPIC", "-Wl,--no-as-needed", "-Wl,--enable-new-dtags,-rpath,$ORIGIN/lib",
        "-o", str(out["cu12_runpath_ext"]), str(ext), f"-L{root / 'cuda12'}", "-l:libcudart.so.12",
    )  # fmt: skip
    # A Python extension module whose NEEDED libcudart.so.12 is nowhere on this machine.
    mods = root / "mods"
    mods.mkdir()
    out["mods"] = mods
    gcc("-shared", "-fPIC", "-Wl,--no-as-needed", "-o", str(mods / "needs_cudart12.so"), str(ext), f"-L{root / 'cuda12'}", "-l:libcudart.so.12")
    # A Python extension module that imports a c10 symbol the installed torch does not export.
    torch_lib = _torch_lib_dir()
    if torch_lib:
        bad = root / "bad.c"
        bad.write_text(f"void {MISSING_C10_SYMBOL}(void);\nvoid call_it(void) {{ {MISSING_C10_SYMBOL}(); }}\n")
        gcc(
            "-shared", "-fPIC", "-Wl,--no-as-needed", "-Wl,--unresolved-symbols=ignore-all", f"-Wl,-rpath,{torch_lib}",
            "-o", str(mods / "torch_abi_ext.so"), str(bad), f"-L{torch_lib}", "-lc10",
        )  # fmt: skip
    # A pure-Python package whose own import needs a module that is not installed.
    (mods / "needs_missing_dep").mkdir()
    (mods / "needs_missing_dep" / "__init__.py").write_text("import soundfile_ddtree_absent  # noqa: F401\n")
    return out


def _torch_lib_dir() -> str | None:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(list(spec.submodule_search_locations)[0]) / "lib"
    return str(lib) if (lib / "libc10.so").exists() else None


# ---- ELF --------------------------------------------------------------------------------------------


def test_elf_reader_matches_readelf(artefacts):
    for key in ("cu12_ext", "cu12_runpath_ext"):
        dyn = abi.read_elf_dynamic(artefacts[key])
        readelf = subprocess.run(["readelf", "-d", str(artefacts[key])], capture_output=True, text=True).stdout if shutil.which("readelf") else ""
        assert "libcudart.so.12" in dyn["needed"]
        if readelf:
            for name in dyn["needed"]:
                assert f"[{name}]" in readelf
    assert abi.read_elf_dynamic(artefacts["cu12_runpath_ext"])["runpath"] == ["$ORIGIN/lib"]


def test_elf_reader_without_section_headers_uses_program_headers(artefacts, tmp_path):
    # Zero e_shoff/e_shnum: the loader never needs section headers, and stripped objects may lack them.
    data = bytearray(artefacts["cu12_runpath_ext"].read_bytes())
    data[0x28:0x30] = b"\0" * 8  # e_shoff (ELF64)
    data[0x3C:0x3E] = b"\0" * 2  # e_shnum
    headless = tmp_path / "headless.so"
    headless.write_bytes(bytes(data))
    dyn = abi.read_elf_dynamic(headless)
    assert "libcudart.so.12" in dyn["needed"] and dyn["runpath"] == ["$ORIGIN/lib"]


def test_not_an_elf_file(tmp_path):
    path = tmp_path / "x.so"
    path.write_text("not elf")
    with pytest.raises(abi.ElfError):
        abi.read_elf_dynamic(path)


def test_extension_needing_another_cuda_major_than_torch(artefacts):
    result = abi.check_extension(str(artefacts["cu12_runpath_ext"]), "13", [], {})
    assert [p["class"] for p in result["problems"]] == ["cuda-major-mismatch"]
    assert "needs libcudart.so.12 (CUDA 12) but torch is built for CUDA 13" in result["problems"][0]["reason"]


def test_extension_whose_cuda_runtime_resolves_through_runpath(artefacts):
    result = abi.check_extension(str(artefacts["cu12_runpath_ext"]), "12", [], {})
    assert result["problems"] == []
    assert result["needs"][0]["via"] == "runpath" and result["needs"][0]["found"].endswith("withrunpath/lib/libcudart.so.12")


def test_extension_whose_cuda_runtime_is_missing(artefacts):
    result = abi.check_extension(str(artefacts["cu12_ext"]), "12", [], {})
    assert [p["class"] for p in result["problems"]] == ["missing-cuda-runtime"]
    # ...and the env's nvidia/*/lib directories count, as torch preloads them
    env_dir = artefacts["cu12_runpath_ext"].parent / "lib"
    assert abi.check_extension(str(artefacts["cu12_ext"]), "12", [str(env_dir)], {})["problems"] == []


# ---- imports: real loader and import-system failures, classified ----------------------------------


def child_import(module: str, artefacts) -> dict:
    env = dict(os.environ, PYTHONPATH=str(artefacts["mods"]))
    proc = subprocess.run(
        [sys.executable, str(MANIFEST_SCRIPT), "--_child", "import", module], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_undefined_torch_symbol_is_a_torch_abi_mismatch(artefacts):
    if not (artefacts["mods"] / "torch_abi_ext.so").exists():
        pytest.skip("needs torch's libc10.so to link against")
    result = child_import("torch_abi_ext", artefacts)
    assert result["ok"] is False and f"undefined symbol: {MISSING_C10_SYMBOL}" in result["message"]
    assert (result["class"], result["torch_symbol"]) == ("torch-abi-mismatch", True)


def test_missing_cuda_runtime_library_is_classified(artefacts):
    result = child_import("needs_cudart12", artefacts)
    assert "libcudart.so.12: cannot open shared object file" in result["message"]
    assert (result["class"], result["library"]) == ("missing-cuda-runtime", "libcudart.so.12")


def test_missing_python_dependency_is_named(artefacts):
    result = child_import("needs_missing_dep", artefacts)
    assert (result["class"], result["missing"]) == ("missing-python-dependency", "soundfile_ddtree_absent")


def test_absent_module_is_not_installed(artefacts):
    assert child_import("sgl_kernel_absent_here", artefacts)["class"] == "not-installed"


# ---- the whole manifest -----------------------------------------------------------------------------


def run_manifest(artefacts, *args: str) -> tuple[int, dict]:
    env = dict(os.environ, PYTHONPATH=str(artefacts["mods"]))
    proc = subprocess.run(
        [sys.executable, str(MANIFEST_SCRIPT), "--expect-gpu-arch", "none", *args], capture_output=True, text=True, env=env, timeout=300
    )
    return proc.returncode, json.loads(proc.stdout)


def test_manifest_fails_on_required_broken_modules_and_names_each_class(artefacts):
    rc, manifest = run_manifest(
        artefacts, "--require", "needs_missing_dep", "--require", "needs_cudart12", "--extension", str(artefacts["cu12_ext"])
    )
    assert rc == 1 and manifest["ok"] is False
    by_name = {c["name"]: c for c in manifest["checks"]}
    assert by_name["import:needs_missing_dep"]["class"] == "missing-python-dependency"
    assert by_name["import:needs_cudart12"]["class"] == "missing-cuda-runtime"
    assert by_name["elf:" + str(artefacts["cu12_ext"])]["status"] == "fail"
    assert by_name["import:sgl_kernel"]["status"] == "skip"  # not installed and not required


def test_manifest_of_this_env_passes(artefacts):
    rc, manifest = run_manifest(artefacts)
    assert rc == 0 and manifest["ok"] is True, [c for c in manifest["checks"] if not c["ok"]]
    assert {c["name"] for c in manifest["checks"]} >= {"driver", "torch", "pip_check"}


def test_drift_against_expected_packages(artefacts, tmp_path):
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps({"pytest": "0.0.1", "ddtree-absent-dist": "1.0"}))
    rc, manifest = run_manifest(artefacts, "--expect-packages", str(pins))
    check = next(c for c in manifest["checks"] if c["name"] == "packages")
    assert rc == 1 and check["class"] == "drift"
    assert set(check["drift"]) == {"pytest", "ddtree-absent-dist"} and check["drift"]["ddtree-absent-dist"]["installed"] is None


# ---- pure rules -------------------------------------------------------------------------------------


def test_driver_table_agrees_with_the_knowledge_file():
    from ddtree_ops import knowledge

    assert abi.FULL_DRIVER_FOR_CUDA == knowledge.cuda()["full_driver_for_cuda"]
    assert abi.MINOR_COMPAT_DRIVER_FOR_MAJOR == {k: v["min_driver"] for k, v in knowledge.cuda()["minor_version_compat"].items()}


@pytest.mark.parametrize(
    "driver, cuda, status",
    [
        ("580.159.04", "13.0", "ok"),
        ("575.57.08", "13.0", "fail"),
        ("575.57.08", "12.9", "ok"),
        ("535.183.01", "12.8", "warn"),  # minor-version compatibility
        ("470.256.02", "12.8", "fail"),
        (None, "12.8", "fail"),
        ("580.65.06", None, "skip"),
    ],
)
def test_driver_for_torch_cuda(driver, cuda, status):
    assert abi.check_driver_for_cuda(driver, cuda)[0] == status


@pytest.mark.parametrize(
    "sm, archs, status",
    [
        ("sm_90", ["sm_80", "sm_90", "sm_100", "sm_120"], "ok"),
        ("sm_86", ["sm_80", "sm_90"], "ok"),  # sm_80 cubins run on sm_86
        ("sm_120", ["sm_80", "sm_90", "sm_100"], "fail"),  # no cross-major binary compatibility
        ("sm_120", ["sm_90", "compute_90"], "warn"),  # PTX only
        ("sm_90", ["sm_90a"], "ok"),  # arch-specific cubins run on exactly that compute capability
        ("sm_103", ["sm_100a"], "fail"),  # ...and on no other minor
    ],
)
def test_gpu_arch_in_torch_arch_list(sm, archs, status):
    assert abi.arch_supported(sm, archs)[0] == status


def test_real_h200_manifest_fixture():
    manifest = json.loads(FIXTURE_MANIFEST.read_text())
    checks = {c["name"]: c for c in manifest["checks"]}
    assert manifest["ok"] is True and manifest["torch"]["cuda"] == "13.0"
    assert checks["gpu_arch"]["status"] == "ok" and "sm_90" in manifest["torch"]["arch_list"]
    assert checks["elf:torch"]["needs"]["libcudart.so.13"].endswith("libcudart.so.13")


# ---- GPU: a real "no kernel image" from a kernel built for another architecture ----------------------

KERNEL_CU = r"""
#include <cuda_runtime.h>
__global__ void set_one(int *x) { *x = 1; }
extern "C" const char *launch(void) {
    int *d = 0;
    cudaError_t e = cudaMalloc(&d, sizeof(int));
    if (e == cudaSuccess) { set_one<<<1, 1>>>(d); e = cudaGetLastError(); }
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    return cudaGetErrorString(e);
}
"""


@pytest.mark.gpu
def test_kernel_without_code_for_this_gpu_is_a_missing_architecture(tmp_path):
    import ctypes

    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    smi = shutil.which("nvidia-smi")
    if not nvcc or not smi or subprocess.run([smi], capture_output=True).returncode != 0:
        pytest.skip("needs nvcc and a working GPU")
    cap = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True).stdout.split()[0]
    other = "120" if cap.replace(".", "") != "120" else "90"  # machine code for an architecture this GPU is not, no PTX
    src = tmp_path / "k.cu"
    src.write_text(KERNEL_CU)
    lib = tmp_path / f"sm{other}_only.so"
    subprocess.run([nvcc, "-shared", "-Xcompiler", "-fPIC", f"-gencode=arch=compute_{other},code=sm_{other}", "-o", str(lib), str(src)], check=True)
    launch = ctypes.CDLL(str(lib)).launch
    launch.restype = ctypes.c_char_p
    message = launch().decode()
    assert "no kernel image is available" in message
    assert abi.classify_import_failure("sm_only_ext", "RuntimeError", message)["class"] == "missing-architecture"
