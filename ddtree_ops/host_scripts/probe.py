#!/usr/bin/env python3
"""Print one JSON document of host facts: driver, GPUs, NVML state, CUDA toolkit, glibc, OS, Python, disk.

Runs on a bare host with any python3 >= 3.8 and the standard library only: it is copied to hosts
(by Ansible's `script` module or over SSH) before anything is installed there. It never fails on a
missing tool; a fact it cannot read is null, and `errors` says why.

    python3 probe.py [--driver-version 580.65.06] [--disk-path /opt] > facts.json

`DDTREE_DRIVER_VERSION` (or `--driver-version`) overrides the driver version, so a lock or an image
can be planned on a machine without a GPU.
"""

import argparse
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time

PROBE_FORMAT = 1

# nvidia-smi prints this (exit 18) when the loaded kernel module and the user-space NVML differ,
# typically after a driver upgrade without a reboot; GPUs are unusable until the module reloads.
_NVML_MISMATCH = "driver/library version mismatch"
_SMI_QUERY = "index,name,uuid,compute_cap,memory.total,pci.bus_id"


def _run(argv, timeout=20.0):
    """(returncode, stdout, stderr) of argv, or None when the program is absent or hangs."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")


def _read(path):
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def parse_proc_driver_version(text):
    """The driver version in /proc/driver/nvidia/version, e.g. 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06 ...'."""
    if not text:
        return None
    match = re.search(r"Kernel Module(?: for [\w-]+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    if match:
        return match.group(1)
    match = re.search(r"NVRM version:.*?\b(\d{3}\.\d+(?:\.\d+)?)\b", text)
    return match.group(1) if match else None


def parse_smi_gpus(text):
    """GPU rows of `nvidia-smi --query-gpu=index,name,uuid,compute_cap,memory.total,pci.bus_id --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 5:
            continue
        index, name, uuid, cap, mem = cells[:5]
        gpu = {
            "index": int(index) if index.isdigit() else len(gpus),
            "name": name,
            "uuid": uuid,
            "compute_capability": cap if re.match(r"^\d+\.\d+$", cap) else None,
            "sm": "sm_" + cap.replace(".", "") if re.match(r"^\d+\.\d+$", cap) else None,
            "memory_total_mib": int(float(mem)) if re.match(r"^[\d.]+$", mem) else None,
            "pci_bus_id": cells[5] if len(cells) > 5 else None,
        }
        gpus.append(gpu)
    return gpus


def probe_nvidia(errors):
    """Driver version and its source, GPU list, and the NVML state ('ok', 'mismatch', 'no-driver', 'error')."""
    driver, source = None, None
    text = _read("/sys/module/nvidia/version")
    if text and text.strip():
        driver, source = text.strip(), "/sys/module/nvidia/version"
    if driver is None:
        driver = parse_proc_driver_version(_read("/proc/driver/nvidia/version"))
        source = "/proc/driver/nvidia/version" if driver else None

    gpus, nvml_state, nvml_message = [], "no-driver", None
    smi = shutil.which("nvidia-smi")
    if smi is None:
        if driver:
            nvml_state, nvml_message = "error", "the nvidia kernel module is loaded but nvidia-smi is not on PATH"
    else:
        result = _run([smi, "--query-gpu=" + _SMI_QUERY, "--format=csv,noheader,nounits"])
        if result is None:
            nvml_state, nvml_message = "error", "nvidia-smi did not answer within 20 s"
        else:
            rc, out, err = result
            message = (out + "\n" + err).strip()
            if _NVML_MISMATCH in message.lower():
                nvml_state, nvml_message = "mismatch", message.splitlines()[0] if message else None
            elif rc != 0:
                nvml_state = "no-driver" if "couldn't communicate with the nvidia driver" in message.lower() else "error"
                nvml_message = message[-500:] or ("nvidia-smi exited %d" % rc)
            else:
                nvml_state = "ok"
                gpus = parse_smi_gpus(out)
                if driver is None:
                    result = _run([smi, "--query-gpu=driver_version", "--format=csv,noheader"])
                    if result and result[0] == 0 and result[1].strip():
                        driver, source = result[1].splitlines()[0].strip(), "nvidia-smi"
        if nvml_message:
            errors.append("nvidia-smi: " + nvml_message)

    override = os.environ.get("DDTREE_DRIVER_VERSION")
    return {
        "driver_version": driver,
        "driver_version_source": source,
        "driver_version_override": override or None,
        "nvml_state": nvml_state,
        "nvml_message": nvml_message,
        "gpus": gpus,
    }


def parse_nvcc_version(text):
    """'12.9' from nvcc --version output ('Cuda compilation tools, release 12.9, V12.9.86')."""
    match = re.search(r"release (\d+\.\d+)", text or "")
    return match.group(1) if match else None


def probe_cuda_toolkit():
    candidates = []
    found = shutil.which("nvcc")
    if found:
        candidates.append(found)
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            candidates.append(os.path.join(root, "bin", "nvcc"))
    for nvcc in candidates:
        if not os.path.exists(nvcc):
            continue
        result = _run([nvcc, "--version"])
        if result and result[0] == 0:
            return {"nvcc": os.path.realpath(nvcc), "version": parse_nvcc_version(result[1])}
    return None


def probe_glibc():
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION")  # 'glibc 2.35'
        if text:
            name, _, version = text.partition(" ")
            return {"name": name, "version": version}
    except (AttributeError, ValueError, OSError):
        pass
    name, version = platform.libc_ver()
    return {"name": name or None, "version": version or None}


def parse_os_release(text):
    facts = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            facts[key.strip()] = value.strip().strip('"').strip("'")
    return {
        "id": facts.get("ID"),
        "version_id": facts.get("VERSION_ID"),
        "pretty_name": facts.get("PRETTY_NAME"),
        "codename": facts.get("VERSION_CODENAME"),
    }


def probe_disk(path):
    # The path may not exist yet on a fresh host; the filesystem that will hold it is its nearest parent.
    probe_path = path
    while probe_path and not os.path.exists(probe_path):
        probe_path = os.path.dirname(probe_path.rstrip("/")) or "/"
    usage = shutil.disk_usage(probe_path or "/")
    return {"path": path, "measured_at": probe_path, "free_bytes": usage.free, "total_bytes": usage.total}


def probe(disk_path="/opt", driver_override=None):
    """All host facts as a dict (the probe's JSON format, `format` = PROBE_FORMAT)."""
    if driver_override:
        os.environ["DDTREE_DRIVER_VERSION"] = driver_override
    errors = []
    nvidia = probe_nvidia(errors)
    facts = {
        "format": PROBE_FORMAT,
        "probed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "hostname": socket.gethostname(),
        "machine": platform.machine(),
        "kernel": platform.release(),
        "os": parse_os_release(_read("/etc/os-release")),
        "glibc": probe_glibc(),
        "python": {
            "executable": sys.executable,
            "version": "%d.%d.%d" % sys.version_info[:3],
        },
        "cuda_toolkit": probe_cuda_toolkit(),
        "disk": probe_disk(disk_path),
        "errors": errors,
    }
    facts.update(nvidia)
    if facts["driver_version_override"]:
        facts["driver_version_detected"] = facts["driver_version"]
        facts["driver_version"] = facts["driver_version_override"]
        facts["driver_version_source"] = "override"
    return facts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver-version", help="use this driver version instead of the detected one")
    parser.add_argument("--disk-path", default="/opt", help="report free space of the filesystem holding this path")
    args = parser.parse_args(argv)
    json.dump(probe(args.disk_path, args.driver_version), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
