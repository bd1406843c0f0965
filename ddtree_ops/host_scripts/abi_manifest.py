#!/usr/bin/env python3
"""Verify a Python environment's CUDA/ABI chain, driver to GPU machine code, and print one JSON manifest.

Run it with the TARGET environment's interpreter (the venv being verified), not the system python:

    /opt/ddtree/envs/<hash>/bin/python abi_manifest.py --expect-gpu-arch auto \
        [--require sgl_kernel --require flashinfer --require ddtree_engine] [--expect-packages pins.json] > manifest.json

Standard library only at import time; torch, sgl_kernel, flashinfer and ddtree_engine are imported
in child processes of the same interpreter, so a segfault or a CUDA hang in one of them becomes a
failed check instead of a lost manifest. Exit status 0 when every check passed (or was skipped),
1 when one failed; the manifest is printed either way.

Checks (each {name, status: ok|warn|fail|skip, ok, reason, class?, details}):
  driver            the driver loads (NVML state) and is new enough for torch.version.cuda
  torch             torch imports; its version, CUDA version, C++ ABI flag
  torch_cuda        CUDA initialises and a tiny kernel runs on every visible GPU
  gpu_arch          each GPU's sm_XY (or a binary-compatible one) is in torch.cuda.get_arch_list()
  import:<module>   sgl_kernel / flashinfer / ddtree_engine / sglang import, failures classified
  elf:<package>     every CUDA library each compiled extension NEEDs resolves, with torch's CUDA major
  flashinfer_versions  flashinfer-cubin / flashinfer-jit-cache versions equal flashinfer's own
  packages          installed versions equal the expected pins (drift)
  pip_check         no installed distribution lacks a declared dependency
  sglang_plugin     the DDTree plugin is registered in SGLang's entry points (when sglang is present)

Failure classes: torch-abi-mismatch (an `undefined symbol`, e.g. c10::…), missing-cuda-runtime
(libcudart.so.N / libnvrtc.so.N cannot be opened), cuda-major-mismatch (an extension NEEDs another
CUDA major than torch), missing-architecture (no kernel image for this GPU), missing-python-dependency
(ModuleNotFoundError for a module that is not the one imported), not-installed, missing-shared-library,
glibc-too-old, libstdcxx-too-old, driver-too-old, nvml-mismatch, import-error.
"""

import argparse
import glob
import json
import os
import re
import struct
import subprocess
import sys
import sysconfig
import time

MANIFEST_FORMAT = 1

# Minimum Linux driver per CUDA toolkit release when the toolkit and driver match exactly
# (CUDA Toolkit release notes, table 3 "CUDA Toolkit and Corresponding Driver Versions").
# Kept in sync with ddtree_ops/knowledge/cuda_drivers.json by tests/ddtree_ops/test_manifest.py.
FULL_DRIVER_FOR_CUDA = {
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}
# Minor-version compatibility: any driver at or above this runs binaries of that CUDA major, but
# without PTX JIT of newer PTX and without features that need a newer driver.
MINOR_COMPAT_DRIVER_FOR_MAJOR = {"11": "450.80.02", "12": "525.60.13", "13": "580.65.06"}

# Libraries whose soname major follows the CUDA major they were built for.
CUDA_MAJOR_LIBS = ("cudart", "nvrtc", "cublas", "cublasLt", "nvJitLink")
# Other NVIDIA libraries worth resolving; their soname majors are their own (cuDNN 9, NCCL 2, ...).
OTHER_NVIDIA_LIBS = ("cudnn", "nccl", "cusparse", "cufft", "curand", "cusolver", "cupti", "nvToolsExt")
_NVIDIA_SONAME = re.compile(r"^lib(" + "|".join(CUDA_MAJOR_LIBS + OTHER_NVIDIA_LIBS) + r")\.so\.(\d+)(?:\.[\d.]+)?$")

DEFAULT_MODULES = ("sgl_kernel", "flashinfer", "ddtree_engine", "sglang")
# Which distributions own the extensions we scan, and where their .so files live relative to site-packages.
ELF_PACKAGES = {
    "torch": ("torch/lib", "torch"),
    "sgl_kernel": ("sgl_kernel",),
    "flashinfer": ("flashinfer",),
    "flashinfer_jit_cache": ("flashinfer_jit_cache",),
    "ddtree_engine": ("ddtree_engine",),
}
_MAX_SO_PER_PACKAGE = 400
_CHILD_TIMEOUT_S = 300.0  # importing sglang or initialising CUDA on 8 GPUs can take a while


# --------------------------------------------------------------------------------------------- ELF


class ElfError(ValueError):
    pass


DT_NEEDED, DT_STRTAB, DT_SONAME, DT_RPATH, DT_RUNPATH = 1, 5, 14, 15, 29


def read_elf_dynamic(path):
    """{'needed': [...], 'soname', 'rpath': [...], 'runpath': [...]} of an ELF shared object (stdlib only).

    Reads the dynamic section through the section headers, falling back to the program headers
    (PT_DYNAMIC + DT_STRTAB mapped through PT_LOAD) when a stripped file has none.
    """
    with open(path, "rb") as fh:
        data = fh.read()
    if data[:4] != b"\x7fELF":
        raise ElfError("%s is not an ELF file" % path)
    ei_class, ei_data = data[4], data[5]
    if ei_class not in (1, 2) or ei_data not in (1, 2):
        raise ElfError("%s: unknown ELF class/encoding %d/%d" % (path, ei_class, ei_data))
    end = "<" if ei_data == 1 else ">"
    is64 = ei_class == 2
    if is64:
        hdr = struct.unpack_from(end + "HHIQQQIHHHHHH", data, 16)
    else:
        hdr = struct.unpack_from(end + "HHIIIIIHHHHHH", data, 16)
    e_phoff, e_shoff = hdr[4], hdr[5]
    e_phentsize, e_phnum, e_shentsize, e_shnum = hdr[8], hdr[9], hdr[10], hdr[11]
    dyn_fmt = end + ("qQ" if is64 else "iI")
    dyn_size = struct.calcsize(dyn_fmt)

    def entries(offset, size):
        out = []
        for pos in range(offset, min(offset + size, len(data)) - dyn_size + 1, dyn_size):
            tag, val = struct.unpack_from(dyn_fmt, data, pos)
            if tag == 0:
                break
            out.append((tag, val))
        return out

    dynamic, strtab_off = None, None
    if e_shoff and e_shnum:
        sh_fmt = end + ("IIQQQQIIQQ" if is64 else "IIIIIIIIII")
        sections = [struct.unpack_from(sh_fmt, data, e_shoff + i * e_shentsize) for i in range(e_shnum)]
        for sec in sections:
            if sec[1] == 6:  # SHT_DYNAMIC; sh_link = its string table
                dynamic = entries(sec[4], sec[5])
                strtab_off = sections[sec[6]][4]
                break
    if dynamic is None and e_phoff and e_phnum:
        ph_fmt = end + ("IIQQQQQQ" if is64 else "IIIIIIII")
        loads, dyn_seg = [], None
        for i in range(e_phnum):
            ph = struct.unpack_from(ph_fmt, data, e_phoff + i * e_phentsize)
            if is64:
                p_type, p_offset, p_vaddr, p_filesz = ph[0], ph[2], ph[3], ph[5]
            else:
                p_type, p_offset, p_vaddr, p_filesz = ph[0], ph[1], ph[2], ph[4]
            if p_type == 1:
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == 2:
                dyn_seg = (p_offset, p_filesz)
        if dyn_seg is not None:
            dynamic = entries(*dyn_seg)
            strtab_vaddr = next((v for t, v in dynamic if t == DT_STRTAB), None)
            for vaddr, offset, filesz in loads:
                if strtab_vaddr is not None and vaddr <= strtab_vaddr < vaddr + filesz:
                    strtab_off = strtab_vaddr - vaddr + offset
    if dynamic is None:
        return {"needed": [], "soname": None, "rpath": [], "runpath": []}  # a static object
    if strtab_off is None:
        raise ElfError("%s: dynamic section without a string table" % path)

    def string_at(offset):
        start = strtab_off + offset
        stop = data.find(b"\0", start)
        return data[start:stop].decode("utf-8", "replace")

    result = {"needed": [], "soname": None, "rpath": [], "runpath": []}
    for tag, val in dynamic:
        if tag == DT_NEEDED:
            result["needed"].append(string_at(val))
        elif tag == DT_SONAME:
            result["soname"] = string_at(val)
        elif tag == DT_RPATH:
            result["rpath"].extend(p for p in string_at(val).split(":") if p)
        elif tag == DT_RUNPATH:
            result["runpath"].extend(p for p in string_at(val).split(":") if p)
    return result


def ldconfig_cache():
    """{soname: path} from `ldconfig -p` (the dynamic loader's cache); {} when ldconfig is absent."""
    for ldconfig in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            out = subprocess.run([ldconfig, "-p"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            continue
        cache = {}
        for line in out.stdout.decode("utf-8", "replace").splitlines():
            # '\tlibcudart.so.12 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudart.so.12'
            match = re.match(r"\s*(\S+)\s+\((.*?)\)\s+=>\s+(\S+)", line)
            if match and _same_word_size(match.group(2)):
                cache.setdefault(match.group(1), match.group(3))
        return cache
    return {}


def _same_word_size(flags):
    # 32-bit entries ('libc6' alone on x86-64, or 'i386') cannot satisfy a 64-bit extension.
    is64 = sys.maxsize > 2**32
    return ("64" in flags) == is64 or not is64 and "i386" in flags


def env_library_dirs(site_dirs):
    """Directories where an env's pip-installed CUDA libraries live (torch preloads these at import)."""
    dirs = []
    for site in site_dirs:
        for pattern in ("nvidia/*/lib", "nvidia/*/lib64", "nvidia/lib", "torch/lib"):
            dirs.extend(sorted(glob.glob(os.path.join(site, pattern))))
    return dirs


def resolve_library(name, so_path, dynamic, env_dirs, cache):
    """(path, via) where the loader (or torch's preload) would find `name` for `so_path`, or (None, None)."""
    origin = os.path.dirname(os.path.abspath(so_path))

    def expand(entries):
        return [e.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for e in entries]

    search = []
    if not dynamic.get("runpath"):
        search += [(d, "rpath") for d in expand(dynamic.get("rpath", []))]
    search += [(d, "LD_LIBRARY_PATH") for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    search += [(d, "runpath") for d in expand(dynamic.get("runpath", []))]
    search += [(d, "env") for d in env_dirs]
    for directory, via in search:
        candidate = os.path.join(directory, name)
        if os.path.exists(candidate):
            return candidate, via
    if name in cache:
        return cache[name], "ld.so.cache"
    for directory in ("/lib64", "/usr/lib64", "/lib", "/usr/lib", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"):
        candidate = os.path.join(directory, name)
        if os.path.exists(candidate):
            return candidate, "default"
    return None, None


def check_extension(so_path, torch_cuda_major, env_dirs, cache):
    """Problems (list of dicts with class/reason) of one compiled extension's NVIDIA library needs.

    Every libcudart/libnvrtc/... NEEDED entry must resolve, and the CUDA-major libraries must carry
    torch's CUDA major (an extension built for CUDA 12 inside a CUDA 13 torch loads a second,
    mismatched runtime or none at all).
    """
    try:
        dynamic = read_elf_dynamic(so_path)
    except (OSError, ElfError, struct.error) as err:
        return dynamic_error(so_path, err)
    problems, needs = [], []
    for name in dynamic["needed"]:
        match = _NVIDIA_SONAME.match(name)
        if not match:
            continue
        lib, major = match.group(1), match.group(2)
        found, via = resolve_library(name, so_path, dynamic, env_dirs, cache)
        needs.append({"library": name, "found": found, "via": via})
        if lib in CUDA_MAJOR_LIBS and torch_cuda_major and major != str(torch_cuda_major):
            problems.append(
                {
                    "class": "cuda-major-mismatch",
                    "reason": "%s needs %s (CUDA %s) but torch is built for CUDA %s: install the build of this "
                    "package made for CUDA %s" % (so_path, name, major, torch_cuda_major, torch_cuda_major),
                }
            )
        elif found is None:
            problems.append(
                {
                    "class": "missing-cuda-runtime",
                    "reason": "%s needs %s, which is not in its RUNPATH, the env's nvidia/*/lib or torch/lib "
                    "directories, LD_LIBRARY_PATH or the ld.so cache: install the matching nvidia-*-cu%s "
                    "wheel (or the CUDA %s runtime)" % (so_path, name, major, major),
                }
            )
    return {"needs": needs, "problems": problems}


def dynamic_error(so_path, err):
    return {"needs": [], "problems": [{"class": "unreadable-elf", "reason": "%s: %s" % (so_path, err)}]}


# ------------------------------------------------------------------------------ import classification


_UNDEFINED_SYMBOL = re.compile(r"undefined symbol:\s*(\S+)")
_CANNOT_OPEN = re.compile(r"(lib[\w+.-]+?\.so(?:\.[\d.]+)?): cannot open shared object file")
_TORCH_NAMESPACES = ("_ZN3c10", "_ZNK3c10", "_ZN2at", "_ZNK2at", "_ZN5torch", "_ZNK5torch", "_ZN6caffe2")


def classify_import_failure(module, exc_type, message, missing_name=None):
    """{'class', 'reason'} for a failed `import module`.

    Args:
        module: the module that was imported, e.g. 'sgl_kernel'.
        exc_type: the exception's class name ('ModuleNotFoundError', 'ImportError', 'OSError', ...).
        message: str(exception).
        missing_name: ModuleNotFoundError.name, when there is one.
    """
    top = module.split(".")[0]
    if exc_type == "ModuleNotFoundError":
        missing = missing_name or (re.findall(r"No module named '([^']+)'", message) or [None])[0]
        if missing and (missing == module or missing.split(".")[0] == top):
            return {"class": "not-installed", "reason": "%s is not installed in this environment" % module}
        return {
            "class": "missing-python-dependency",
            "missing": missing,
            "reason": "importing %s needs the Python module %r, which is not installed: add the distribution "
            "that provides it to the lock" % (module, missing),
        }
    match = _UNDEFINED_SYMBOL.search(message)
    if match:
        symbol = match.group(1)
        torch_symbol = symbol.startswith(_TORCH_NAMESPACES)
        return {
            "class": "torch-abi-mismatch",
            "symbol": symbol,
            "torch_symbol": torch_symbol,
            "reason": "%s was built against a different torch than the one installed (undefined symbol %s%s): "
            "install the %s build made for this torch version, or the torch version it was built for"
            % (module, symbol, ", a torch C++ symbol" if torch_symbol else "", module),
        }
    match = _CANNOT_OPEN.search(message)
    if match:
        lib = match.group(1)
        if lib.startswith("libcuda.so"):
            return {
                "class": "missing-driver-library",
                "library": lib,
                "reason": "%s needs the NVIDIA driver's %s, which this host does not have: install the driver "
                "(or run the container with GPU access)" % (module, lib),
            }
        nv = _NVIDIA_SONAME.match(lib)
        if nv:
            return {
                "class": "missing-cuda-runtime",
                "library": lib,
                "reason": "%s needs %s (CUDA %s) and it cannot be found: the env has no CUDA %s runtime for it "
                "— install the extension built for torch's CUDA, or the nvidia-*-cu%s runtime wheels"
                % (module, lib, nv.group(2), nv.group(2), nv.group(2)),
            }
        return {"class": "missing-shared-library", "library": lib, "reason": "%s needs %s, which cannot be found" % (module, lib)}
    if re.search(r"version `GLIBC_[\d.]+' not found", message):
        return {"class": "glibc-too-old", "reason": "%s needs a newer glibc than this host's: %s" % (module, message.strip())}
    if re.search(r"version `(GLIBCXX|CXXABI)_[\d.]+' not found", message):
        return {
            "class": "libstdcxx-too-old",
            "reason": "%s needs a newer libstdc++ than the one loaded: %s" % (module, message.strip()),
        }
    lowered = message.lower()
    if "no kernel image is available" in lowered or "not compatible with the current pytorch" in lowered or re.search(
        r"(unsupported|no kernels? for) (gpu )?arch", lowered
    ):
        return {"class": "missing-architecture", "reason": "%s has no machine code for this GPU: %s" % (module, message.strip())}
    if "driver version is insufficient" in lowered or "found no nvidia driver" in lowered:
        return {"class": "driver-too-old", "reason": "%s: %s" % (module, message.strip())}
    if "driver/library version mismatch" in lowered:
        return {
            "class": "nvml-mismatch",
            "reason": "the loaded NVIDIA kernel module and user-space driver differ (upgraded without a reboot): "
            "reboot the host or reload the nvidia modules",
        }
    return {"class": "import-error", "reason": "import %s failed: %s: %s" % (module, exc_type, message.strip()[:500])}


# ---------------------------------------------------------------------------------- child processes


def _child_import(module):
    """Import `module` here and print {ok, version, file} or the classified failure (child mode)."""
    import importlib

    try:
        mod = importlib.import_module(module)
    except BaseException as exc:  # noqa: BLE001 - any failure is the finding
        result = {"ok": False, "exc_type": type(exc).__name__, "message": str(exc)}
        result.update(classify_import_failure(module, type(exc).__name__, str(exc), getattr(exc, "name", None)))
    else:
        result = {"ok": True, "version": getattr(mod, "__version__", None), "file": getattr(mod, "__file__", None)}
    print(json.dumps(result))


def _child_torch():
    """Torch facts and a tiny kernel launch on every GPU (child mode)."""
    facts = {}
    try:
        import torch
    except BaseException as exc:  # noqa: BLE001
        facts["import_error"] = classify_import_failure("torch", type(exc).__name__, str(exc), getattr(exc, "name", None))
        print(json.dumps(facts))
        return
    facts["version"] = torch.__version__
    facts["cuda"] = torch.version.cuda
    facts["git"] = getattr(torch.version, "git_version", None)
    facts["cxx11_abi"] = bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", False))
    facts["file"] = torch.__file__
    try:
        facts["arch_list"] = list(torch.cuda.get_arch_list())
    except Exception as exc:  # noqa: BLE001
        facts["arch_list"] = []
        facts["arch_list_error"] = str(exc)
    facts["cuda_available"] = False
    facts["devices"] = []
    try:
        facts["cuda_available"] = bool(torch.cuda.is_available())
        if facts["cuda_available"]:
            for index in range(torch.cuda.device_count()):
                major, minor = torch.cuda.get_device_capability(index)
                device = {"index": index, "name": torch.cuda.get_device_name(index), "sm": "sm_%d%d" % (major, minor)}
                try:
                    value = (torch.ones(8, device="cuda:%d" % index) * 2).sum().item()
                    device["kernel_ok"] = value == 16.0
                except Exception as exc:  # noqa: BLE001
                    device["kernel_ok"] = False
                    device["kernel_error"] = classify_import_failure("torch", type(exc).__name__, str(exc))
                facts["devices"].append(device)
    except Exception as exc:  # noqa: BLE001
        facts["cuda_error"] = classify_import_failure("torch", type(exc).__name__, str(exc))
    print(json.dumps(facts))


def run_child(mode, arg=None, timeout=_CHILD_TIMEOUT_S):
    """Run this script in child `mode` with the same interpreter; its JSON, or a failure dict."""
    argv = [sys.executable, os.path.abspath(__file__), "--_child", mode] + ([arg] if arg else [])
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "class": "timeout", "reason": "%s %s did not finish within %d s" % (mode, arg or "", timeout)}
    lines = [ln for ln in proc.stdout.decode("utf-8", "replace").splitlines() if ln.startswith("{")]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    stderr = proc.stderr.decode("utf-8", "replace").strip()
    return {
        "ok": False,
        "class": "crashed",
        "reason": "%s %s exited %d: %s" % (mode, arg or "", proc.returncode, stderr[-800:]),
    }


# ------------------------------------------------------------------------------------------ driver


def version_tuple(text):
    return tuple(int(p) for p in re.findall(r"\d+", text or ""))


def detect_driver(override=None):
    """(driver version or None, source, nvml_state)."""
    if override or os.environ.get("DDTREE_DRIVER_VERSION"):
        return override or os.environ["DDTREE_DRIVER_VERSION"], "override", "unknown"
    for path in ("/sys/module/nvidia/version",):
        try:
            with open(path) as fh:
                text = fh.read().strip()
            if text:
                return text, path, _nvml_state()
        except OSError:
            pass
    try:
        with open("/proc/driver/nvidia/version") as fh:
            match = re.search(r"Kernel Module(?: for [\w-]+)?\s+(\d+\.\d+(?:\.\d+)?)", fh.read())
        if match:
            return match.group(1), "/proc/driver/nvidia/version", _nvml_state()
    except OSError:
        pass
    return None, None, _nvml_state()


def _nvml_state():
    try:
        proc = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "no-nvidia-smi"
    text = proc.stdout.decode("utf-8", "replace").lower()
    if "driver/library version mismatch" in text:
        return "mismatch"
    return "ok" if proc.returncode == 0 else "error"


def check_driver_for_cuda(driver, torch_cuda):
    """(status, reason) of running a torch built for CUDA `torch_cuda` on driver `driver`."""
    if not torch_cuda:
        return "skip", "torch is a CPU build"
    if not driver:
        return "fail", "torch is built for CUDA %s but no NVIDIA driver is loaded on this host" % torch_cuda
    major_minor = ".".join(torch_cuda.split(".")[:2])
    major = torch_cuda.split(".")[0]
    full = FULL_DRIVER_FOR_CUDA.get(major_minor)
    compat = MINOR_COMPAT_DRIVER_FOR_MAJOR.get(major)
    have = version_tuple(driver)
    if full and have >= version_tuple(full):
        return "ok", "driver %s >= %s, the driver of CUDA %s" % (driver, full, major_minor)
    if compat and have >= version_tuple(compat):
        if major_minor == "%s.0" % major or full is None and compat == full:
            return "ok", "driver %s >= %s" % (driver, compat)
        return (
            "warn",
            "driver %s runs CUDA %s only through minor-version compatibility (>= %s): no JIT of newer PTX, "
            "so every GPU needs native machine code in each extension; a driver >= %s removes the limit"
            % (driver, major_minor, compat, full or "?"),
        )
    return (
        "fail",
        "torch is built for CUDA %s, which needs a driver >= %s; this host has %s — upgrade the driver or "
        "use a lock for an older CUDA" % (major_minor, compat or full or "?", driver),
    )


# ------------------------------------------------------------------------------------- arch matching


def arch_supported(sm, arch_list):
    """(status, how) for GPU `sm` ('sm_90') against torch.cuda.get_arch_list().

    A cubin for sm_XY runs on sm_XZ with Z >= Y (same major); PTX (compute_XY) JIT-compiles to any
    newer GPU but only when the driver supports that PTX (not under minor-version compatibility).
    """
    number = int(sm.split("_")[1].rstrip("af"))
    major, minor = divmod(number, 10)
    entries = []
    for arch in arch_list:
        match = re.match(r"^(sm|compute)_(\d+)([af]?)$", arch)
        if match:
            entries.append((match.group(1), int(match.group(2)), match.group(3)))
    if any(kind == "sm" and n == number for kind, n, _ in entries):
        return "ok", "native %s machine code" % sm
    for kind, n, suffix in entries:
        m, mi = divmod(n, 10)
        if kind == "sm" and not suffix and m == major and mi <= minor:
            return "ok", "binary-compatible sm_%d machine code" % n
    for kind, n, _ in entries:
        if kind == "compute" and n <= number:
            return "warn", "only compute_%d PTX, JIT-compiled at first use (slow start; needs a driver with full PTX support)" % n
    return "fail", "torch has no machine code for %s (its arch list: %s)" % (sm, " ".join(arch_list) or "empty")


# ------------------------------------------------------------------------------------- the manifest


def site_dirs():
    dirs = []
    for key in ("purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path and path not in dirs and os.path.isdir(path):
            dirs.append(path)
    return dirs


def dist_version(name):
    try:
        from importlib import metadata
    except ImportError:  # python 3.7
        return None
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _check(name, status, reason, **details):
    entry = {"name": name, "status": status, "ok": status != "fail", "reason": reason}
    entry.update(details)
    return entry


def shared_objects(package, sites):
    """Compiled extension files of `package` in the env (at most _MAX_SO_PER_PACKAGE)."""
    found = []
    for site in sites:
        for rel in ELF_PACKAGES.get(package, (package,)):
            root = os.path.join(site, rel)
            if not os.path.isdir(root):
                continue
            if package == "torch":  # torch/lib holds the libs; torch/_C*.so the extension; no deep walk
                found.extend(sorted(glob.glob(os.path.join(root, "*.so*"))))
                continue
            for dirpath, _dirs, files in os.walk(root):
                for name in sorted(files):
                    if name.endswith(".so") or ".so." in name:
                        found.append(os.path.join(dirpath, name))
    unique = sorted(set(found))
    return unique[:_MAX_SO_PER_PACKAGE], len(unique)


def build_manifest(args):
    checks = []
    sites = site_dirs()
    driver, driver_source, nvml_state = detect_driver(args.driver_version)

    torch = run_child("torch")
    torch_ok = "import_error" not in torch and "version" in torch
    torch_cuda = torch.get("cuda") if torch_ok else None
    torch_cuda_major = torch_cuda.split(".")[0] if torch_cuda else None

    if nvml_state == "mismatch":
        checks.append(
            _check(
                "driver",
                "fail",
                "nvidia-smi reports a driver/library version mismatch: the kernel module and user-space driver "
                "differ (upgraded without a reboot) — reboot the host or reload the nvidia modules",
                **{"class": "nvml-mismatch", "driver_version": driver}
            )
        )
    else:
        status, reason = check_driver_for_cuda(driver, torch_cuda)
        checks.append(_check("driver", status, reason, driver_version=driver, driver_source=driver_source, nvml_state=nvml_state))

    if not torch_ok:
        failure = torch.get("import_error") or torch
        checks.append(_check("torch", "fail", failure.get("reason"), **{"class": failure.get("class")}))
    else:
        checks.append(
            _check(
                "torch",
                "ok",
                "torch %s (CUDA %s, cxx11 ABI %s)" % (torch["version"], torch_cuda or "none", torch.get("cxx11_abi")),
                version=torch["version"],
                cuda=torch_cuda,
                cxx11_abi=torch.get("cxx11_abi"),
                arch_list=torch.get("arch_list"),
            )
        )

    # GPUs and their architectures
    devices = torch.get("devices") or []
    expected = []
    if args.expect_gpu_arch == "auto":
        expected = [d["sm"] for d in devices]
    elif args.expect_gpu_arch not in ("none", ""):
        expected = [a.strip() for a in args.expect_gpu_arch.split(",") if a.strip()]
    if torch_ok and torch_cuda:
        if torch.get("cuda_error"):
            err = torch["cuda_error"]
            checks.append(_check("torch_cuda", "fail", err["reason"], **{"class": err["class"]}))
        elif not torch.get("cuda_available"):
            status = "fail" if args.expect_gpu_arch != "none" else "skip"
            checks.append(_check("torch_cuda", status, "torch.cuda.is_available() is False (no GPU visible or the driver is unusable)"))
        else:
            bad = [d for d in devices if not d.get("kernel_ok")]
            if bad:
                err = bad[0].get("kernel_error") or {"class": "kernel-failed", "reason": "a test kernel returned a wrong result"}
                checks.append(_check("torch_cuda", "fail", "GPU %d (%s): %s" % (bad[0]["index"], bad[0]["name"], err["reason"]), **{"class": err["class"]}))
            else:
                checks.append(_check("torch_cuda", "ok", "a test kernel ran on %d GPU(s): %s" % (len(devices), ", ".join(sorted({d["name"] for d in devices}))), devices=devices))
    if torch_ok and expected:
        results = []
        worst = "ok"
        for sm in sorted(set(expected)):
            status, how = arch_supported(sm, torch.get("arch_list") or [])
            results.append("%s: %s" % (sm, how))
            worst = max(worst, status, key=["ok", "warn", "fail"].index)
        details = {"expected": sorted(set(expected)), "arch_list": torch.get("arch_list")}
        if worst == "fail":
            details["class"] = "missing-architecture"
        checks.append(_check("gpu_arch", worst, "; ".join(results), **details))
    elif args.expect_gpu_arch == "auto" and torch_ok and not devices:
        checks.append(_check("gpu_arch", "skip", "no GPU visible to torch, nothing to match"))

    # imports
    modules = list(DEFAULT_MODULES)
    for extra in args.require:
        if extra not in modules:
            modules.append(extra)
    imported = {}
    for module in modules:
        result = run_child("import", module)
        imported[module] = result
        if result.get("ok"):
            checks.append(_check("import:" + module, "ok", "imports (%s)" % (result.get("version") or "no __version__"), version=result.get("version")))
        elif result.get("class") == "not-installed" and module not in args.require:
            checks.append(_check("import:" + module, "skip", result["reason"], **{"class": "not-installed"}))
        else:
            checks.append(_check("import:" + module, "fail", result.get("reason"), **{"class": result.get("class")}))

    # ELF needs of compiled extensions
    env_dirs = env_library_dirs(sites)
    cache = ldconfig_cache()
    for package in list(ELF_PACKAGES) + [p for p in args.extension_package if p not in ELF_PACKAGES]:
        files, total = shared_objects(package, sites)
        if not files:
            continue
        problems, needs = [], {}
        for so in files:
            result = check_extension(so, torch_cuda_major, env_dirs, cache)
            problems.extend(result["problems"])
            for need in result["needs"]:
                needs.setdefault(need["library"], need["found"])
        status = "fail" if problems else "ok"
        reason = problems[0]["reason"] if problems else "%d shared objects; NVIDIA libraries resolve%s" % (
            len(files),
            " with CUDA %s" % torch_cuda_major if torch_cuda_major else "",
        )
        details = {"files_scanned": len(files), "files_total": total, "needs": needs}
        if problems:
            details["class"] = problems[0]["class"]
            details["problems"] = problems[:20]
        checks.append(_check("elf:" + package, status, reason, **details))
    for so in args.extension:
        result = check_extension(so, torch_cuda_major, env_dirs, cache)
        problems = result["problems"]
        checks.append(
            _check(
                "elf:" + so,
                "fail" if problems else "ok",
                problems[0]["reason"] if problems else "NVIDIA libraries resolve",
                needs=result["needs"],
                **({"class": problems[0]["class"]} if problems else {})
            )
        )

    # FlashInfer's precompiled parts must come from the same release as FlashInfer itself
    fi_version = dist_version("flashinfer-python") or dist_version("flashinfer")
    if fi_version:
        parts = {name: dist_version(name) for name in ("flashinfer-cubin", "flashinfer-jit-cache")}
        base = fi_version.split("+")[0]
        wrong = {n: v for n, v in parts.items() if v and v.split("+")[0] != base}
        if wrong:
            checks.append(
                _check(
                    "flashinfer_versions",
                    "fail",
                    "flashinfer %s with %s: install the cubin/jit-cache packages of the same version"
                    % (fi_version, ", ".join("%s %s" % kv for kv in sorted(wrong.items()))),
                    **{"class": "version-mismatch", "versions": parts}
                )
            )
        else:
            checks.append(_check("flashinfer_versions", "ok", "flashinfer %s; %s" % (fi_version, parts), versions=parts))

    # drift against the lock's pins
    if args.expect_packages:
        if args.expect_packages.lstrip().startswith("{"):
            pins = json.loads(args.expect_packages)
        else:
            with open(args.expect_packages) as fh:
                pins = json.load(fh)
        drift = {}
        for name, want in sorted(pins.items()):
            have = dist_version(name)
            if have != want:
                drift[name] = {"expected": want, "installed": have}
        checks.append(
            _check(
                "packages",
                "fail" if drift else "ok",
                ("%d package(s) differ from the lock: " % len(drift) + ", ".join(
                    "%s %s (lock %s)" % (n, d["installed"] or "missing", d["expected"]) for n, d in drift.items()
                )) if drift else "%d pinned packages match the lock" % len(pins),
                **({"class": "drift", "drift": drift} if drift else {})
            )
        )

    checks.append(pip_check())

    plugin = sglang_plugin_check(args.require)
    if plugin is not None:
        checks.append(plugin)

    return {
        "format": MANIFEST_FORMAT,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ok": all(c["ok"] for c in checks),
        "python": {"executable": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3], "prefix": sys.prefix},
        "site_packages": sites,
        "driver": {"version": driver, "source": driver_source, "nvml_state": nvml_state},
        "torch": {k: torch.get(k) for k in ("version", "cuda", "cxx11_abi", "arch_list", "cuda_available", "devices")} if torch_ok else None,
        "packages": {
            name: dist_version(name)
            for name in ("torch", "sglang", "sglang-kernel", "sgl-kernel", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache", "ddtree-engine", "triton")
        },
        "checks": checks,
    }


def sglang_plugin_check(required):
    """The `sglang_plugin` check, or None when sglang is not installed (nothing to plug into).

    Reads installed metadata only (importlib.metadata): an entry point whose name contains "ddtree" in
    SGLang's group `sglang.srt.plugins`, which the engine wheel declares. Without it SGLang starts but
    `--speculative-algorithm DDTREE` is unknown; that fails the check when ddtree_engine is required.
    """
    if not dist_version("sglang"):
        return None
    try:
        from importlib import metadata

        eps = metadata.entry_points()
        group = eps.select(group="sglang.srt.plugins") if hasattr(eps, "select") else eps.get("sglang.srt.plugins", [])
        found = sorted((ep.name, ep.value) for ep in group)
    except Exception as exc:  # noqa: BLE001
        found, error = [], str(exc)
    else:
        error = None
    names = [name for name, _ in found]
    ours = ["%s = %s" % (name, value) for name, value in found if "ddtree" in name.lower()]
    status = "ok" if ours else ("fail" if "ddtree_engine" in required else "skip")
    if ours:
        reason = "DDTree plugin registered in sglang.srt.plugins (%s)" % ", ".join(ours)
    else:
        reason = (
            "no DDTree entry point in sglang.srt.plugins (%s): install the ddtree-engine wheel into this env "
            "next to sglang" % (error or names)
        )
    return _check("sglang_plugin", status, reason, entry_points=names)


def pip_check():
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "check"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return _check("pip_check", "skip", "pip check did not run: %s" % exc)
    out = proc.stdout.decode("utf-8", "replace").strip()
    err = proc.stderr.decode("utf-8", "replace")
    if "No module named pip" in err:
        return _check("pip_check", "skip", "pip is not installed in this environment")
    if proc.returncode == 0:
        return _check("pip_check", "ok", "no broken requirements")
    missing = re.findall(r"requires ([\w.-]+), which is not installed", out)
    return _check(
        "pip_check",
        "fail",
        "declared dependencies are missing or conflict: " + "; ".join(out.splitlines()[:10]),
        **{"class": "missing-python-dependency" if missing else "dependency-conflict", "missing": missing}
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--_child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--expect-gpu-arch", default="auto", help="auto (the visible GPUs), none, or sm_90[,sm_120]")
    parser.add_argument("--driver-version", help="use this driver version instead of the detected one")
    parser.add_argument("--require", action="append", default=[], help="a module that must import (repeatable)")
    parser.add_argument("--extension", action="append", default=[], help="also check this .so file's CUDA needs (repeatable)")
    parser.add_argument("--extension-package", action="append", default=[], help="also scan this package's .so files")
    parser.add_argument("--expect-packages", help="{distribution: version} of the lock's pins: a JSON file, or the JSON itself")
    parser.add_argument("--output", help="also write the manifest to this file")
    args = parser.parse_args(argv)
    if args._child:
        if args._child[0] == "torch":
            _child_torch()
        else:
            _child_import(args._child[1])
        return 0
    manifest = build_manifest(args)
    text = json.dumps(manifest, indent=2, sort_keys=False)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text + "\n")
    sys.stdout.write(text + "\n")
    return 0 if manifest["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
