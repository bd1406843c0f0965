"""Host facts: run the stdlib probe script (here or on a host over SSH) and validate its JSON.

The script itself is `host_scripts/probe.py` (it runs with a bare python3 on the host); this module
is the control side: it turns that JSON into `HostFacts`, refusing malformed documents with a
message that names the field, so a recorded facts file (`provision --plan --facts FILE`) gets the
same checks as a live probe.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.version import Version

from ..config import Host
from ..exceptions import ConfigError, HostError
from ..progress import Progress, silent
from .ansible import run_playbook
from .ssh import SSH, Transport

HOST_SCRIPTS = Path(__file__).resolve().parent.parent / "host_scripts"
PROBE_SCRIPT = HOST_SCRIPTS / "probe.py"
MANIFEST_SCRIPT = HOST_SCRIPTS / "abi_manifest.py"
SUPPORTED_FORMATS = (1,)
NVML_STATES = ("ok", "mismatch", "no-driver", "error")
_VERSION = re.compile(r"^\d+(\.\d+)+$")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    sm: str  # "sm_90"
    compute_capability: str  # "9.0"
    memory_total_mib: int | None = None


@dataclass(frozen=True)
class HostFacts:
    """What the probe found on one host (the probe's JSON, validated)."""

    hostname: str
    machine: str  # "x86_64"
    driver_version: str | None  # "580.65.06"; the override when one was given
    driver_version_source: str | None  # "/sys/module/nvidia/version" | "/proc/driver/nvidia/version" | "nvidia-smi" | "override"
    nvml_state: str  # ok | mismatch | no-driver | error
    nvml_message: str | None
    gpus: tuple[Gpu, ...]
    cuda_toolkit: str | None  # nvcc's "12.9", None when no toolkit
    glibc: str | None  # "2.35"
    os_id: str | None  # "ubuntu"
    os_version: str | None  # "24.04"
    python_version: str  # "3.12.3"
    python_executable: str | None
    disk_free_bytes: int | None
    disk_path: str
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def python_tag(self) -> str:
        major, minor = Version(self.python_version).release[:2]
        return f"cp{major}{minor}"

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("raw")
        return d


def _require(doc: dict, key: str, where: str, kinds: tuple[type, ...], optional: bool = False):
    if key not in doc:
        if optional:
            return None
        raise ConfigError(f"{where}: the probe document has no {key!r}: re-run host_scripts/probe.py to record it")
    value = doc[key]
    if value is None and optional:
        return None
    if not isinstance(value, kinds):
        names = "/".join(k.__name__ for k in kinds)
        raise ConfigError(f"{where}: {key!r} must be {names}, got {type(value).__name__} ({value!r})")
    return value


def parse_facts(doc: object, where: str = "facts") -> HostFacts:
    """Validate a probe JSON document and return HostFacts.

    Args:
        doc: the parsed JSON of host_scripts/probe.py.
        where: names the source in error messages (a file path or a host name).
    Raises:
        ConfigError: a missing or malformed field, named with the fix.
    """
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: a probe document is a JSON object, got {type(doc).__name__}")
    fmt = _require(doc, "format", where, (int,))
    if fmt not in SUPPORTED_FORMATS:
        raise ConfigError(f"{where}: probe format {fmt} is not supported (this ddtree-ops reads {SUPPORTED_FORMATS})")
    nvml_state = _require(doc, "nvml_state", where, (str,))
    if nvml_state not in NVML_STATES:
        raise ConfigError(f"{where}: nvml_state must be one of {', '.join(NVML_STATES)}, got {nvml_state!r}")
    driver = _require(doc, "driver_version", where, (str,), optional=True)
    if driver is not None and not _VERSION.match(driver):
        raise ConfigError(f"{where}: driver_version {driver!r} is not a version like 580.65.06")
    gpus = []
    for i, g in enumerate(_require(doc, "gpus", where, (list,))):
        gw = f"{where}: gpus[{i}]"
        if not isinstance(g, dict):
            raise ConfigError(f"{gw} must be an object")
        cap = _require(g, "compute_capability", gw, (str,), optional=True)
        if cap is None or not re.match(r"^\d+\.\d+$", cap):
            raise ConfigError(f"{gw}: compute_capability {cap!r} is not like '9.0' (nvidia-smi too old for compute_cap?)")
        gpus.append(
            Gpu(
                index=int(_require(g, "index", gw, (int,))),
                name=_require(g, "name", gw, (str,)),
                uuid=_require(g, "uuid", gw, (str,)),
                sm="sm_" + cap.replace(".", ""),
                compute_capability=cap,
                memory_total_mib=_require(g, "memory_total_mib", gw, (int,), optional=True),
            )
        )
    python = _require(doc, "python", where, (dict,))
    py_version = _require(python, "version", f"{where}: python", (str,))
    if not _VERSION.match(py_version):
        raise ConfigError(f"{where}: python.version {py_version!r} is not a version like 3.12.3")
    toolkit = _require(doc, "cuda_toolkit", where, (dict,), optional=True)
    glibc = _require(doc, "glibc", where, (dict,), optional=True) or {}
    os_info = _require(doc, "os", where, (dict,), optional=True) or {}
    disk = _require(doc, "disk", where, (dict,), optional=True) or {}
    return HostFacts(
        hostname=str(doc.get("hostname") or ""),
        machine=str(doc.get("machine") or ""),
        driver_version=driver,
        driver_version_source=doc.get("driver_version_source"),
        nvml_state=nvml_state,
        nvml_message=doc.get("nvml_message"),
        gpus=tuple(gpus),
        cuda_toolkit=(toolkit or {}).get("version"),
        glibc=glibc.get("version"),
        os_id=os_info.get("id"),
        os_version=os_info.get("version_id"),
        python_version=py_version,
        python_executable=python.get("executable"),
        disk_free_bytes=disk.get("free_bytes"),
        disk_path=str(disk.get("path") or "/opt"),
        raw=doc,
    )


def load_facts(path: str | os.PathLike) -> HostFacts:
    """HostFacts from a recorded probe file. Raises ConfigError (exit 2) when it is unreadable or malformed."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as err:
        raise ConfigError(f"--facts {p}: cannot read it ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"--facts {p}: not JSON ({err.msg} at line {err.lineno}); record it with host_scripts/probe.py") from None
    return parse_facts(doc, str(p))


def _parse_output(stdout: str, where: str) -> HostFacts:
    try:
        doc = json.loads(stdout)
    except json.JSONDecodeError as err:
        raise HostError(f"{where}: the probe printed something that is not JSON ({err.msg}): {stdout[:300]!r}") from None
    try:
        return parse_facts(doc, where)
    except ConfigError as err:  # a live probe that returns garbage is the host's failure, not bad input
        raise HostError(str(err)) from None


def probe_local(python: str = sys.executable, driver_version: str | None = None, timeout_s: float = 60.0) -> HostFacts:
    """Run the probe on this machine (for planning images on a build box)."""
    argv = [python, str(PROBE_SCRIPT)] + (["--driver-version", driver_version] if driver_version else [])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise HostError(f"the local probe exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return _parse_output(proc.stdout, "local probe")


def probe_host(
    host: Host, python: str = "python3", timeout_s: float = 60.0, connect_timeout_s: int = 10, transport: Transport = SSH
) -> HostFacts:
    """Run the probe on `host` over SSH (the script travels on stdin; nothing is written there).

    Args:
        python: the host's interpreter to run it with.
        transport: the SSH seam.
    Returns:
        the validated facts.
    Raises:
        HostError: the host is unreachable, has no `python3`, or the probe failed.
    """
    proc = transport.exec(
        host,
        f"{python} - --disk-path /opt",
        timeout_s=timeout_s,
        what="the probe",
        input_text=PROBE_SCRIPT.read_text(),
        connect_timeout_s=connect_timeout_s,
    )
    if proc.returncode == 127 or "not found" in proc.stderr and proc.returncode != 0:
        raise HostError(f"host {host.name}: {python} is not installed there; install python3 (>= 3.8) first")
    if proc.returncode != 0:
        raise HostError(f"host {host.name}: the probe exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return _parse_output(proc.stdout, f"host {host.name}")


MAX_PARALLEL_PROBES = 16  # a probe is one ssh process waiting on the network: cheap to run side by side


def probe_in_parallel(
    hosts: list[Host], probe: Callable[[Host], HostFacts], progress: Progress = silent
) -> list[HostFacts | HostError]:
    """Probe every host at once, so N unreachable hosts cost one connect timeout, not N.

    Args:
        hosts: the hosts to probe.
        probe: one host -> its facts (e.g. `probe_host` with a connect timeout); raises HostError.
        progress: one line as each host answers or fails, with its seconds.
    Returns:
        per host, in the order given: its facts, or the HostError its probe raised.
    """

    def one(host: Host) -> HostFacts | HostError:
        started = time.monotonic()
        try:
            facts = probe(host)
        except HostError as err:
            progress(f"probe: {host.name}: failed after {time.monotonic() - started:.1f}s")
            return err
        progress(f"probe: {host.name}: done in {time.monotonic() - started:.1f}s")
        return facts

    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_PROBES, len(hosts))) as pool:
        return list(pool.map(one, hosts))


PROBE_PLAYBOOK = "probe.yml"
PROBE_TASK = "Run the probe script with the host's Python"


def probe_hosts_ansible(project, hosts: list[Host], python: str | None = None) -> dict[str, HostFacts]:
    """Run the probe on every host through Ansible (ansible/probe.yml); {host name: HostFacts}.

    Raises:
        HostError: a host was unreachable, the script failed, or it printed no valid facts.
    """
    outputs: dict[str, str] = {}

    def collect(event: dict) -> None:
        data = event.get("event_data") or {}
        if event.get("event") == "runner_on_ok" and data.get("task") == PROBE_TASK:
            outputs[data.get("host")] = (data.get("res") or {}).get("stdout", "")

    extravars = {"ddtree_probe_python": python or project.engine.install.python}
    run_playbook(PROBE_PLAYBOOK, project, hosts, extravars, on_event=collect)
    facts = {}
    for host in hosts:
        if host.name not in outputs:
            raise HostError(f"host {host.name}: the probe task returned nothing; see the Ansible log")
        facts[host.name] = _parse_output(outputs[host.name], f"host {host.name}")
    return facts
