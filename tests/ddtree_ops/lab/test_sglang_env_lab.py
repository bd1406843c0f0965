"""A real sglang 0.5.23 cu130 env, installed by provision on a lab host from the air-gapped wheelhouse.

Opt-in (DDTREE_HEAVY=1): the wheelhouse is ~5 GB of CUDA wheels and the env ~10 GB. The lab host has
no GPU, so it stands in for an H200 host: its real probe (Python, glibc, disk, OS) with the H200
fixture's driver and GPU grafted on. Everything after the probe is real: the lock, the download
checked against the frozen closure's hashes, the copy, pip in the lock's order, `pip check`, and the
ABI manifest, which then fails on this GPU-less host for the reasons a host without a driver has.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import yaml

from ddtree_ops.config import parse_project
from ddtree_ops.hosts.probe import load_facts, probe_host
from ddtree_ops.provision.run import provision
from ddtree_ops.hosts.ssh import SSH

pytestmark = [
    pytest.mark.lab,
    pytest.mark.slow,
    pytest.mark.heavy,
    pytest.mark.skipif(os.environ.get("DDTREE_HEAVY") != "1", reason="downloads ~5 GB: set DDTREE_HEAVY=1"),
]

H200 = Path(__file__).resolve().parents[2] / "fixtures" / "hosts" / "h200-probe.json"


def test_provision_installs_the_cuda_lock_in_the_locks_order_and_verifies_it(lab_fleet):
    doc = yaml.safe_load(open(lab_fleet.config_path))
    doc["engine"]["backend"] = "sglang"
    # flashinfer.ai's index (the JIT cache) is not reachable from here; PyPI is.
    doc["engine"]["install"] = {"flashinfer_jit_cache": False}
    doc["services"] = [{"name": "tree", "algorithm": "ddtree", "budget": 15, "topk": 8, "port": 30001}]
    project = parse_project(doc)
    lab2 = project.host("lab-2")
    h200 = load_facts(H200)

    def probe_as_h200(host):
        real = probe_host(host)
        return dataclasses.replace(real, driver_version=h200.driver_version, nvml_state="ok", gpus=h200.gpus)

    report = provision(project, [lab2], probe=probe_as_h200)
    (row,) = report.hosts
    lock = next(iter(report.locks.values()))
    assert (lock["sglang_version"], lock["cuda_flavour"], lock["python_tag"]) == ("0.5.23", "cu130", "cp311")
    assert len(lock["pins"]) > 200 and row.status == "provisioned"

    # The env holds exactly the lock: pip check passed in the role; the pins match what is installed.
    listing = SSH.run(lab2, f"{row.env}/bin/python -m pip list --format json", timeout_s=120)
    installed = {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(listing)}
    for pin in lock["pins"]:
        name, _, version = pin.partition("==")
        assert installed.get(name) == version, f"{pin}: installed {installed.get(name)}"
    torch = SSH.run(lab2, f"{row.env}/bin/python -c 'import torch; print(torch.__version__, torch.version.cuda)'", timeout_s=300)
    assert torch.split() == ["2.14.1+cu130", "13.0"], "PyPI's torch 2.14.1 is the CUDA 13.0 build"

    # No driver on this host: the manifest fails, and says so, rather than passing an env that cannot run.
    assert not row.manifest_ok
    stored = json.loads(SSH.run(lab2, f"cat {row.env}/abi-manifest.json"))
    status = {c["name"]: c["status"] for c in stored["checks"]}
    failed = {c["name"]: c for c in stored["checks"] if c["status"] == "fail"}
    print(json.dumps({name: (c.get("class"), c.get("reason")) for name, c in failed.items()}, indent=1))
    # What a host without a driver lacks, classified as such; no ABI mismatch, no missing package.
    assert set(failed) == {"driver", "torch_cuda", "import:sgl_kernel"}, failed
    assert failed["import:sgl_kernel"]["class"] == "missing-driver-library"
    assert "libcuda.so.1" in failed["import:sgl_kernel"]["reason"]
    # The engine wheel declares its SGLang plugin (entry point group sglang.srt.plugins).
    assert status["sglang_plugin"] == "ok"
    assert status["import:flashinfer"] == "ok" and status["import:ddtree_engine"] == "ok"
