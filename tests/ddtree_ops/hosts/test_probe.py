"""The host probe script (run for real, with stand-in `nvidia-smi` programs on PATH) and facts validation."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_ops.hosts import probe
from ddtree_ops.exceptions import ConfigError, HostError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"
PROBE = probe.PROBE_SCRIPT


def _fake_tool(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _run_probe(tmp_path: Path, env_extra: dict | None = None, smi: str | None = None, args=()) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if smi is not None:
        _fake_tool(bin_dir, "nvidia-smi", smi)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    env.update(env_extra or {})
    # `-I`: the probe must work with nothing but the standard library.
    out = subprocess.run([sys.executable, "-I", str(PROBE), *args], capture_output=True, text=True, env=env, timeout=60, check=True)
    return json.loads(out.stdout)


def test_probe_reads_gpus_from_nvidia_smi(tmp_path):
    smi = """case "$*" in
  *driver_version*) echo "580.82.07";;
  *) printf '0, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-aaaa, 12.0, 97887, 00000000:18:00.0\\n1, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-bbbb, 12.0, 97887, 00000000:19:00.0\\n';;
esac
"""
    doc = _run_probe(tmp_path, smi=smi)
    facts = probe.parse_facts(doc)
    assert doc["nvml_state"] == "ok", doc
    assert [g.sm for g in facts.gpus] == ["sm_120", "sm_120"]
    assert facts.gpus[1].uuid == "GPU-bbbb" and facts.gpus[0].memory_total_mib == 97887
    if not Path("/sys/module/nvidia/version").exists() and not Path("/proc/driver/nvidia/version").exists():
        assert (facts.driver_version, facts.driver_version_source) == ("580.82.07", "nvidia-smi")


def test_probe_reports_nvml_mismatch(tmp_path):
    smi = 'echo "Failed to initialize NVML: Driver/library version mismatch"\necho "NVML library version: 580.95"\nexit 18\n'
    doc = _run_probe(tmp_path, smi=smi)
    assert doc["nvml_state"] == "mismatch"
    assert "version mismatch" in doc["nvml_message"]
    assert doc["gpus"] == []


def test_probe_without_nvidia_smi_has_no_gpus(tmp_path):
    doc = _run_probe(tmp_path)
    facts = probe.parse_facts(doc)
    assert facts.gpus == () and facts.python_version.startswith(f"{sys.version_info[0]}.{sys.version_info[1]}")
    assert facts.disk_free_bytes and facts.disk_free_bytes > 0
    assert facts.glibc  # this test machine is glibc-based


def test_driver_override_by_environment_and_flag(tmp_path):
    doc = _run_probe(tmp_path, env_extra={"DDTREE_DRIVER_VERSION": "575.57.08"})
    assert (doc["driver_version"], doc["driver_version_source"]) == ("575.57.08", "override")
    doc = _run_probe(tmp_path, args=["--driver-version", "580.65.06"])
    assert doc["driver_version"] == "580.65.06"


def test_proc_driver_version_parsing():
    sys.path.insert(0, str(PROBE.parent))
    try:
        import importlib

        script = importlib.import_module("probe")
    finally:
        sys.path.pop(0)
    text = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.82.07  Release Build  (dvs-builder@U16)  Wed Aug 27 2025\nGCC version:  gcc 13.3.0\n"
    assert script.parse_proc_driver_version(text) == "580.82.07"
    legacy = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n"
    assert script.parse_proc_driver_version(legacy) == "535.183.01"
    assert script.parse_nvcc_version("Cuda compilation tools, release 12.9, V12.9.86") == "12.9"


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.stem)
def test_every_recorded_fixture_parses(path):
    facts = probe.load_facts(path)
    assert facts.python_version and facts.nvml_state in probe.NVML_STATES


def test_real_h200_fixture():
    facts = probe.load_facts(FIXTURES / "h200-probe.json")
    assert [g.sm for g in facts.gpus] == ["sm_90"] and facts.gpus[0].name == "NVIDIA H200"
    assert facts.driver_version.startswith("580.") and facts.driver_version_source == "/sys/module/nvidia/version"


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda d: d.pop("nvml_state"), "'nvml_state'"),
        (lambda d: d.update(format=9), "probe format 9"),
        (lambda d: d.update(driver_version="latest"), "driver_version 'latest'"),
        (lambda d: d["gpus"][0].update(compute_capability="[N/A]"), "gpus[0]: compute_capability"),
        (lambda d: d.update(gpus="none"), "'gpus' must be list"),
    ],
)
def test_malformed_facts_name_the_field(tmp_path, mutate, fragment):
    doc = json.loads((FIXTURES / "h200-probe.json").read_text())
    mutate(doc)
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=None) as err:
        probe.load_facts(path)
    assert fragment in str(err.value) and str(path) in str(err.value)


def test_facts_file_that_is_not_json(tmp_path):
    path = tmp_path / "facts.json"
    path.write_text("GPU 0: H200")
    with pytest.raises(ConfigError, match="not JSON"):
        probe.load_facts(path)


def test_probe_local_runs_the_script():
    facts = probe.probe_local(driver_version="580.65.06")
    assert facts.driver_version == "580.65.06" and facts.driver_version_source == "override"


def test_probe_host_unreachable_names_the_host():
    from ddtree_ops.config import Host

    # 127.0.0.1 port 9 (discard) is closed on test machines: ssh fails fast with exit 255.
    host = Host(name="nowhere", address="127.0.0.1", ssh={"port": 9, "user": "root"})
    with pytest.raises(HostError, match="nowhere .*unreachable"):
        probe.probe_host(host, connect_timeout_s=3, timeout_s=20)
