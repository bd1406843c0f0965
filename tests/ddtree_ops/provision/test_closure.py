"""The frozen dependency closures: every package of an sglang env pinned, the engine co-installable,
and the committed files reproducible from PyPI."""

from __future__ import annotations

import dataclasses
import subprocess
import tomllib
from pathlib import Path

import httpx
import pytest

from ddtree_ops.hosts import probe
from ddtree_ops.provision import closure
from ddtree_ops.exceptions import ConfigError
from ddtree_ops.provision.cuda_lock import CudaLock
from ddtree_ops.provision.resolve import resolve

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"
ENGINE_PYPROJECT = Path(__file__).resolve().parents[3] / "engine_patches" / "ddtree_engine" / "pyproject.toml"


def h200_lock(**changes) -> CudaLock:
    facts = dataclasses.replace(probe.load_facts(FIXTURES / "h200-probe.json"), **changes)
    lock = resolve(facts, "h200")
    assert isinstance(lock, CudaLock), lock
    return lock


@pytest.mark.parametrize("python_tag", ["cp311", "cp312", "cp313"])
@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_every_supported_python_and_machine_of_0_5_23_has_a_closure_with_hashes(python_tag, machine):
    found = closure.load("0.5.23", "cu130", python_tag, machine)
    assert found is not None and found.exclude_newer == "2026-11-29"
    assert len(found.pins) > 150
    assert all(found.hashes[name] for name in found.pins), "every pin carries the hashes of its files"
    assert found.pins["torch"] == "2.14.1" and found.pins["sglang-kernel"] == "0.4.10"
    assert found.pins["cuda-toolkit"].startswith("13.0"), "torch 2.14.1 from PyPI brings the CUDA 13.0 user-space"


def test_the_engine_requirements_are_satisfied_inside_the_closure():
    from packaging.requirements import Requirement

    found = closure.load("0.5.23", "cu130", "cp312", "x86_64")
    declared = tomllib.loads(ENGINE_PYPROJECT.read_text())["project"]["dependencies"]
    for line in declared:
        req = Requirement(line)
        pinned = found.pins.get(closure.normalise(req.name))
        assert pinned is not None and req.specifier.contains(pinned), f"{line}: the closure has {pinned}"


def test_the_h200_lock_constrains_the_whole_closure():
    lock = h200_lock()
    found = closure.load("0.5.23", "cu130", "cp312", "x86_64")
    constraints = set(lock.requirements_text().splitlines())
    assert set(found.constraint_lines()) <= constraints
    # Beyond the closure only the FlashInfer JIT cache, from its own index and installed --no-deps.
    assert {line.split("==")[0] for line in constraints - set(found.constraint_lines())} == {"flashinfer-jit-cache"}
    assert not any("no frozen dependency closure" in w for w in lock.warnings)


def test_a_lock_without_a_frozen_closure_says_its_constraints_are_partial(tmp_path, monkeypatch):
    monkeypatch.setattr(closure, "CLOSURES_DIR", tmp_path)  # nothing frozen
    lock = h200_lock()
    assert len(lock.pins) == 10, lock.pins  # the core pins only
    (warning,) = [w for w in lock.warnings if "no frozen dependency closure" in w]
    assert "python -m ddtree_ops.provision.closure freeze --release 0.5.23 --flavour cu130 --python cp312 --machine x86_64" in warning


def test_a_closure_that_contradicts_the_release_data_is_refused(tmp_path, monkeypatch):
    source = closure.CLOSURES_DIR / closure.file_name("0.5.23", "cu130", "cp312", "x86_64")
    bad_dir = tmp_path / "closures"
    bad_dir.mkdir()
    (bad_dir / source.name).write_text(source.read_text().replace("\ntorch==2.14.1 ", "\ntorch==2.14.0 "))
    monkeypatch.setattr(closure, "CLOSURES_DIR", bad_dir)
    with pytest.raises(ConfigError, match=r"pins torch==2.14.0 but sglang_releases.yaml says 2.14.1: freeze the closure again"):
        h200_lock()


def test_sglang_0_5_6_locks_are_planned_but_blocked_by_the_transformers_conflict():
    a100 = probe.load_facts(FIXTURES / "a100-535-probe.json")
    lock = resolve(a100, "a100-535", release="0.5.6")
    assert isinstance(lock, CudaLock) and lock.cuda_flavour == "cu129"
    assert lock.blockers == (
        "sglang 0.5.6 pins transformers==4.57.1 and the DDTree engine needs transformers==5.19.0, so they cannot "
        "share one env — use sglang 0.5.23",
    )


def _pypi_reachable() -> bool:
    try:
        return httpx.get("https://pypi.org/simple/sglang/", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.skipif(not Path(closure.uv_path()).exists(), reason="uv is not installed")
def test_freezing_again_under_the_committed_pins_gives_back_the_committed_closure(tmp_path):
    # Not a bare re-freeze: the index is not append-only in time (ml-dtypes 0.7.0 appeared after the
    # 2026-11-29 freeze dated 2026-11-16), so the committed pins go in as constraints and the resolver
    # must return exactly them, with the same hashes: a hand edit, a requirement added to the engine
    # without a re-freeze, or a file swapped under a pinned version fails this.
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable from here")
    committed = closure.load("0.5.23", "cu130", "cp312", "x86_64")
    pins = tmp_path / "pins.txt"
    pins.write_text("\n".join(committed.constraint_lines()) + "\n")
    fresh_path = closure.freeze("0.5.23", "cu130", "cp312", "x86_64", committed.exclude_newer, out_dir=tmp_path / "out", constraints=pins)
    fresh = closure.parse(fresh_path.read_text(), fresh_path)
    assert set(fresh.pins) ^ set(committed.pins) == set()
    assert {n: v for n, v in fresh.pins.items() if committed.pins[n] != v} == {}
    assert {n for n, h in fresh.hashes.items() if set(h) != set(committed.hashes[n])} == set()
    assert fresh.exclude_newer == committed.exclude_newer == "2026-11-29"


@pytest.mark.skipif(not Path(closure.uv_path()).exists(), reason="uv is not installed")
def test_freezing_a_release_the_engine_conflicts_with_fails_naming_both_pins(tmp_path):
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable from here")
    # 0.5.6's own flavours need PyTorch's index; resolving it against PyPI alone still meets the conflict first.
    argv_inputs = tmp_path / "in.txt"
    argv_inputs.write_text("sglang==0.5.6\n" + "\n".join(closure.engine_requirements()) + "\n")
    proc = subprocess.run(
        [closure.uv_path(), "pip", "compile", "--no-config", "--quiet", "--python-version", "3.12", "--python-platform", "x86_64-manylinux_2_28",
         "--exclude-newer", "2026-11-29", str(argv_inputs)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode != 0 and "transformers==4.57.1" in proc.stderr and "transformers==5.19.0" in proc.stderr
