"""Resolve host facts + engine settings into a CUDA lock for the sglang backend, or refuse with reasons.

Pure: no network, no host access. The rules and versions come from `ddtree_ops/knowledge/*.yaml`
(each fact sourced there); this module only applies them, in this order:

1. the host can be reasoned about at all (NVML not in mismatch, a driver, a GPU, a supported CPU arch);
2. the host's Python and glibc fit the release's wheels; there is disk for the env;
3. every GPU's architecture is known, its driver branch is new enough for the hardware;
4. a CUDA flavour of the release that can target every GPU and that the driver runs, natively
   first, else through minor-version compatibility (with its limits stated);
5. the attention backend asked for (if any) exists on every GPU; the FlashInfer sm_12x toolkit rule.

The lock pins torch, the kernel wheels and FlashInfer with their indexes and the install order
SGLang's own Dockerfile uses: torch first, then the kernel wheels with `--no-deps`, then SGLang and
the engine under a frozen constraints file so nothing can move torch or the kernels.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .. import knowledge
from ..exceptions import ConfigError
from ..hosts.probe import Gpu, HostFacts
from . import closure as closures
from .cuda_lock import CudaLock, InstallStep
from .versions import at_least, major, major_minor, parse, python_tag

SUPPORTED_MACHINES = ("x86_64", "aarch64")


@dataclass(frozen=True)
class Reason:
    code: str  # machine-readable: driver-too-old, nvml-mismatch, no-gpu, python-version, ...
    message: str  # what is wrong and what would fix it


@dataclass(frozen=True)
class Refusal:
    """Why no lock can be made for a host, each reason with its fix."""

    host: str
    reasons: tuple[Reason, ...]

    @property
    def message(self) -> str:
        return "; ".join(r.message for r in self.reasons)

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(r.code for r in self.reasons)

    def to_dict(self) -> dict:
        return {"host": self.host, "refused": True, "reasons": [asdict(r) for r in self.reasons], "message": self.message}


# --------------------------------------------------------------------------------------------- rules


def release_data(version: str | None) -> tuple[str, dict]:
    data = knowledge.releases()
    version = version or data["default_release"]
    releases = data["releases"]
    if version not in releases:
        raise ConfigError(
            f"sglang {version} is not a release this ddtree-ops knows; supported: {', '.join(sorted(releases))} "
            "(add it to ddtree_ops/knowledge/sglang_releases.yaml with its sources)"
        )
    return version, releases[version]


def _gpu_label(gpu: Gpu, same: int) -> str:
    more = f" (and {same - 1} more of the same model)" if same > 1 else ""
    name = gpu.name.removeprefix("NVIDIA ").strip()
    # Letters read with a leading vowel sound ("an RTX", "an H200", "an A100", "an L40S").
    article = "an" if name[:1].upper() in "AEFHILMNORSX" else "a"
    return f"GPU {gpu.index}{more} is {article} {name} ({gpu.sm})"


def _distinct_gpus(gpus: tuple[Gpu, ...]) -> list[tuple[Gpu, int]]:
    seen: dict[tuple[str, str], list[Gpu]] = {}
    for gpu in gpus:
        seen.setdefault((gpu.name, gpu.sm), []).append(gpu)
    return [(group[0], len(group)) for group in seen.values()]


def _arch_in_list(sm: str, archs: list[str]) -> bool:
    # A cubin for sm_XY runs on sm_XZ, Z >= Y (same major); the PTX fallback is not counted (needs JIT).
    number = int(sm.split("_")[1])
    for arch in archs:
        n = int(arch.split("_")[1].rstrip("af"))
        if n == number or (n // 10 == number // 10 and n % 10 <= number % 10):
            return True
    return False


def _flavour_driver_mode(flavour: dict, driver: str, cuda_rules: dict) -> str | None:
    """'native', 'minor-version-compat', or None when the driver cannot run this flavour."""
    cuda_version = flavour["cuda"]
    full = cuda_rules["full_driver_for_cuda"].get(cuda_version)
    if full and at_least(driver, full):
        return "native"
    compat = cuda_rules["minor_version_compat"].get(major(cuda_version), {}).get("min_driver")
    if compat and at_least(driver, compat):
        return "minor-version-compat"
    return None


def requested_attention_backend(extra_args: list[str]) -> str | None:
    """The value of `--attention-backend X` / `--attention-backend=X` in a service's extra args."""
    for i, arg in enumerate(extra_args):
        if arg == "--attention-backend" and i + 1 < len(extra_args):
            return extra_args[i + 1]
        if arg.startswith("--attention-backend="):
            return arg.split("=", 1)[1]
    return None


def resolve(
    facts: HostFacts,
    host_name: str,
    *,
    release: str | None = None,
    engine_source: str = "",
    target_archs: tuple[str, ...] = (),
    attention_backend: str | None = None,
    flashinfer_jit_cache: bool = True,
) -> CudaLock | Refusal:
    """The lock for one host, or why there is none.

    Args:
        facts: the host's probe (live or recorded).
        host_name: names the host in messages.
        release: the SGLang release (default: the knowledge file's default_release).
        engine_source: digest of the DDTree engine's sources (part of the env's identity).
        target_archs: GPU architectures to plan for when the host shows none (image builds on a
            machine without a GPU, with the driver given by DDTREE_DRIVER_VERSION).
        attention_backend: the `--attention-backend` the services ask for, if any.
        flashinfer_jit_cache: install FlashInfer's precompiled JIT cache where the release has one
            (engine.install.flashinfer_jit_cache; off where its index is not mirrored).
    Returns:
        CudaLock, or Refusal with every reason found (not only the first).
    Raises:
        ConfigError: an unknown release or architecture name in the arguments.
    """
    version, rel = release_data(release)
    rules = knowledge.cuda()
    reasons: list[Reason] = []
    warnings: list[str] = []
    fixes_release = _other_release_hint(version)

    if facts.nvml_state == "mismatch":
        loaded = f" (kernel module {facts.driver_version} is loaded)" if facts.driver_version else ""
        return Refusal(
            host_name,
            (
                Reason(
                    "nvml-mismatch",
                    f"host {host_name}: nvidia-smi reports 'Driver/library version mismatch'{loaded}: the driver was "
                    "upgraded without a reboot and no GPU can be used until the loaded kernel module matches the "
                    "user-space driver — reboot the host (or unload and reload the nvidia kernel modules), then probe again",
                ),
            ),
        )
    if facts.machine and facts.machine not in SUPPORTED_MACHINES:
        reasons.append(Reason("machine", f"host {host_name} is {facts.machine}; SGLang's wheels exist for {' and '.join(SUPPORTED_MACHINES)} only"))

    for arch in target_archs:
        if arch not in rules["architectures"]:
            raise ConfigError(f"--gpu-arch {arch}: unknown architecture; known: {', '.join(rules['architectures'])}")
    gpus = facts.gpus
    archs = tuple(sorted({g.sm for g in gpus})) or tuple(sorted(set(target_archs)))
    driver = facts.driver_version

    if not driver:
        reasons.append(
            Reason(
                "no-driver",
                f"host {host_name} has no NVIDIA driver loaded"
                + (f" ({facts.nvml_message})" if facts.nvml_message else "")
                + f": the sglang backend needs an NVIDIA GPU and driver — install the driver "
                f"(>= {_min_driver_any_flavour(rel, rules)} for sglang {version}), or use engine.backend: reference",
            )
        )
    elif not archs:
        reasons.append(
            Reason(
                "no-gpu",
                f"host {host_name} has driver {driver} but nvidia-smi lists no GPU"
                + (f" ({facts.nvml_message})" if facts.nvml_message else "")
                + ": check that the GPUs are visible (nvidia-smi, and that this driver supports them); to plan for a "
                "host without its GPU, give the architecture (--gpu-arch sm_90)",
            )
        )

    # Python, glibc, disk
    py = major_minor(facts.python_version)
    lo, hi = major_minor(rel["python"]["min"]), major_minor(rel["python"]["max"])
    if py is None or not lo <= py <= hi:
        reasons.append(
            Reason(
                "python-version",
                f"sglang {version} needs Python {rel['python']['min']}–{rel['python']['max']}; host {host_name}'s python3 "
                f"is {facts.python_version} — install a supported Python and set engine.install.python to it",
            )
        )
    if facts.glibc and not at_least(facts.glibc, rel["glibc_min"]):
        reasons.append(
            Reason(
                "glibc",
                f"sglang {version}'s wheels need glibc >= {rel['glibc_min']}; host {host_name} has {facts.glibc} "
                f"({facts.os_id} {facts.os_version}) — use a newer OS (Ubuntu 22.04+) or container mode",
            )
        )
    need_disk = int(rules["min_free_bytes_sglang_env"])
    if facts.disk_free_bytes is not None and facts.disk_free_bytes < need_disk:
        reasons.append(
            Reason(
                "disk",
                f"host {host_name} has {facts.disk_free_bytes / 2**30:.1f} GiB free under {facts.disk_path}; an sglang env "
                f"needs about {need_disk / 2**30:.0f} GiB — free space there",
            )
        )

    # GPU architectures against the hardware's driver branch and the CUDA that can target them
    arch_rules = rules["architectures"]
    unknown = [g for g in gpus if g.sm not in arch_rules]
    for gpu, same in _distinct_gpus(tuple(unknown)):
        reasons.append(Reason("unknown-arch", f"{_gpu_label(gpu, same)}, which ddtree-ops has no CUDA data for — add it to knowledge/cuda.yaml"))
    need_cuda = max((parse(arch_rules[a]["min_cuda"]) for a in archs if a in arch_rules), default=None)
    if driver:
        described = _distinct_gpus(tuple(g for g in gpus if g.sm in arch_rules)) or [
            (Gpu(-1, "planned GPU", "", a, ""), 1) for a in archs if a in arch_rules
        ]
        for gpu, same in described:
            need = arch_rules[gpu.sm]
            if not at_least(driver, need["min_driver"]):
                label = _gpu_label(gpu, same) if gpu.index >= 0 else f"the planned {gpu.sm} GPU"
                reasons.append(
                    Reason(
                        "driver-too-old-for-gpu",
                        f"{label}, which needs CUDA >= {need['min_cuda']} and a driver >= {need['min_driver']}; "
                        f"host {host_name} has driver {driver} — upgrade the driver",
                    )
                )

    # CUDA flavour
    flavours = rel["flavours"]
    chosen = None
    if driver and archs and not any(r.code == "driver-too-old-for-gpu" for r in reasons):
        native, compat, rejected = [], [], []
        for name, flavour in flavours.items():
            if need_cuda and parse(flavour["cuda"]) < need_cuda:
                rejected.append(f"{name} cannot target {', '.join(archs)} (needs CUDA >= {need_cuda})")
                continue
            missing = [a for a in archs if not _arch_in_list(a, flavour["torch_archs"])]
            if missing:
                rejected.append(f"torch {rel['torch']} for {name} has no machine code for {', '.join(missing)}")
                continue
            mode = _flavour_driver_mode(flavour, driver, rules)
            if mode == "native":
                native.append(name)
            elif mode == "minor-version-compat":
                compat.append(name)
            else:
                full = rules["full_driver_for_cuda"].get(flavour["cuda"], "?")
                rejected.append(f"{name} (CUDA {flavour['cuda']}) needs a driver >= {full}")
        shipped = " and ".join(flavours)
        if native:
            chosen, mode = native[0], "native"
        elif compat:
            chosen, mode = compat[0], "minor-version-compat"
            cuda_major = major(flavours[chosen]["cuda"])
            warnings.append(
                f"sglang {version} ships kernel wheels for {shipped} only; host {host_name}'s driver {driver} supports "
                f"CUDA {cuda_major}.x only through minor-version compatibility — {chosen} is chosen, with PTX JIT unavailable "
                f"(every kernel needs native code for {', '.join(archs)}); a driver >= "
                f"{rules['full_driver_for_cuda'][flavours[chosen]['cuda']]} lifts this"
            )
        else:
            reasons.append(
                Reason(
                    "driver-too-old",
                    f"sglang {version} ships kernel wheels for {shipped} only: " + "; ".join(rejected)
                    + f"; host {host_name} has driver {driver} — upgrade the driver"
                    + (f", or use {fixes_release}" if fixes_release else ""),
                )
            )

    # attention backend per architecture
    backends = rules["attention_backends"]
    if attention_backend:
        for arch in archs:
            supported = backends.get(arch, {}).get("supported", [])
            if attention_backend not in supported:
                extra = " (FA3 covers sm_80–sm_90 only)" if attention_backend == "fa3" else ""
                reasons.append(
                    Reason(
                        "attention-backend",
                        f"--attention-backend {attention_backend} does not run on {arch}{extra}; on this host use one of "
                        f"{', '.join(supported)}",
                    )
                )
    chosen_backend = attention_backend or (backends.get(archs[0], {}).get("default") if len(set(archs)) == 1 else "triton")

    # FlashInfer on sm_12x compiles missing kernels with the host's toolkit, which must be >= 12.9
    jit_rule = rules["flashinfer_jit_toolkit"]
    jit_archs = [a for a in archs if a in jit_rule["archs"]]
    if jit_archs and (facts.cuda_toolkit is None or not at_least(facts.cuda_toolkit, jit_rule["min_toolkit"])):
        have = f"nvcc {facts.cuda_toolkit}" if facts.cuda_toolkit else "no CUDA toolkit"
        jit_cache = rel["flashinfer"].get("jit_cache")
        warnings.append(
            f"{', '.join(jit_archs)}: FlashInfer JIT-compiles kernels that are not precompiled at first use and needs a CUDA "
            f">= {jit_rule['min_toolkit']} toolkit for sm_12x; host {host_name} has {have} — "
            + (f"the lock installs flashinfer-jit-cache {jit_cache} to avoid most JIT; " if jit_cache else "")
            + f"install a CUDA >= {jit_rule['min_toolkit']} toolkit (and set CUDA_HOME) for the rest"
        )

    if reasons or chosen is None:
        if not reasons:  # cannot happen with the checks above; keeps the type honest
            reasons.append(Reason("unresolvable", f"host {host_name}: no CUDA flavour of sglang {version} fits"))
        return Refusal(host_name, tuple(reasons))

    if not flashinfer_jit_cache and rel["flashinfer"].get("jit_cache"):
        warnings.append(
            "FlashInfer's precompiled JIT cache is left out (engine.install.flashinfer_jit_cache: false): kernels that "
            "flashinfer's own wheels do not carry compile at first use, which needs a CUDA toolkit (nvcc) on the host"
        )
    return _build_lock(version, rel, chosen, mode, facts, archs, chosen_backend, tuple(warnings), engine_source, flashinfer_jit_cache)


def _other_release_hint(version: str) -> str | None:
    # Only a release the engine can share an env with is worth suggesting.
    others = [v for v, rel in knowledge.releases()["releases"].items() if v != version and not rel.get("engine_conflict")]
    if not others:
        return None
    other = others[0]
    flavours = " / ".join(knowledge.releases()["releases"][other]["flavours"])
    return f"sglang {other} ({flavours}) by setting engine.sglang_version: \"{other}\""


def _min_driver_any_flavour(rel: dict, rules: dict) -> str:
    drivers = [rules["minor_version_compat"][major(f["cuda"])]["min_driver"] for f in rel["flavours"].values()]
    return min(drivers, key=parse)


def _platform(rel: dict, machine: str) -> str:
    glibc = rel["glibc_min"].replace(".", "_")
    return f"manylinux_{glibc}_{machine or 'x86_64'}"


def _build_lock(version, rel, flavour_name, mode, facts, archs, backend, warnings, engine_source, jit_cache=True) -> CudaLock:
    flavour = rel["flavours"][flavour_name]
    torch_local = flavour.get("torch_local", "")
    kernel_local = flavour.get("kernel_local", "")
    fi = rel["flashinfer"]
    torch_pins = [
        f"torch=={rel['torch']}{torch_local}",
        f"torchvision=={rel['torchvision']}{torch_local}",
        f"torchaudio=={rel['torchaudio']}{torch_local}",
    ]
    kernel_pin = f"{rel['kernel']['name']}=={rel['kernel']['version']}{kernel_local}"
    fi_pins = [f"flashinfer-python=={fi['python']}"]
    if fi.get("cubin"):
        fi_pins.append(f"flashinfer-cubin=={fi['cubin']}")
    jit_pins = []
    if jit_cache and fi.get("jit_cache") and flavour.get("flashinfer_jit_cache_index"):
        jit_pins.append(f"flashinfer-jit-cache=={fi['jit_cache']}+{flavour_name}")
    extra = [f"{name}=={v}" for name, v in sorted(rel.get("extra_pins", {}).items())]
    steps = [
        # Under the constraints too: torch's own dependencies (the CUDA user-space wheels) are in the closure.
        InstallStep("torch first, from the flavour's torch index", tuple(torch_pins), flavour["torch_index"], use_constraints=True),
        InstallStep(
            "kernel wheels without their dependencies (they must not move torch)",
            (kernel_pin, *fi_pins),
            flavour["kernel_index"],
            extra_index_urls=("https://pypi.org/simple",) if flavour["kernel_index"] != "https://pypi.org/simple" else (),
            no_deps=True,
        ),
    ]
    if jit_pins:
        steps.append(
            InstallStep("FlashInfer's precompiled kernels for this CUDA", tuple(jit_pins), flavour["flashinfer_jit_cache_index"], no_deps=True)
        )
    steps.append(
        InstallStep(
            "sglang and the engine under the frozen constraints",
            (f"sglang=={version}", *extra),
            "https://pypi.org/simple",
            extra_index_urls=(flavour["torch_index"],) if flavour["torch_index"] != "https://pypi.org/simple" else (),
            use_constraints=True,
        )
    )
    core = torch_pins + [kernel_pin] + fi_pins + jit_pins + extra + [f"sglang=={version}"]
    tag = python_tag(facts.python_version)
    machine = facts.machine or "x86_64"
    pins, closure_warning = _constraints(version, flavour_name, tag, machine, core)
    if closure_warning and not rel.get("engine_conflict"):  # with a conflict there is no closure to freeze
        warnings = (*warnings, closure_warning)
    return CudaLock(
        backend="sglang",
        sglang_version=version,
        cuda_flavour=flavour_name,
        cuda_version=flavour["cuda"],
        python_tag=tag,
        platform=_platform(rel, facts.machine),
        pins=pins,
        steps=tuple(steps),
        engine_source=engine_source,
        driver_mode=mode,
        gpu_archs=archs,
        attention_backend=backend,
        warnings=warnings,
        blockers=(f"{rel['engine_conflict']} — use sglang {knowledge.releases()['default_release']}",) if rel.get("engine_conflict") else (),
    )


def _constraints(version: str, flavour: str, python_tag: str, machine: str, core: list[str]) -> tuple[tuple[str, ...], str | None]:
    """The frozen constraints: the committed closure of the release and the engine, with the core pins.

    Returns (sorted pins, a warning when no closure was frozen for this combination).
    Raises ConfigError when the closure contradicts a core pin (the knowledge files disagree).
    """
    found = closures.load(version, flavour, python_tag, machine)
    if found is None:
        return tuple(sorted(core)), (
            f"no frozen dependency closure for sglang {version} {flavour} {python_tag} {machine}: the constraints pin "
            f"the {len(core)} core packages only and the rest may float; freeze one with `python -m ddtree_ops.provision.closure "
            f"freeze --release {version} --flavour {flavour} --python {python_tag} --machine {machine} --exclude-newer DATE`"
        )
    pins = dict(found.pins)
    for line in core:
        name, _, wanted = line.partition("==")
        have = pins.get(closures.normalise(name))
        # A local version (+cu129) or a package outside the closure (the JIT cache, from its own index) is added as is.
        if have is not None and have != wanted and have != wanted.split("+")[0]:
            raise ConfigError(
                f"{found.path.name} pins {name}=={have} but sglang_releases.yaml says {wanted}: freeze the closure again"
            )
        pins[closures.normalise(name)] = wanted
    return tuple(sorted(f"{name}=={v}" for name, v in pins.items())), None
