"""The ABI manifest, control side: run host_scripts/abi_manifest.py in an env, validate its JSON, gate on it.

The manifest is stored next to the env (`<env>/abi-manifest.json`), shown by `healthcheck` and
`doctor`, and checked by `deploy` before a host gets a release (`gate`).
"""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..config import Host
from ..exceptions import CheckFailed, ConfigError, HostError
from ..hosts.layout import STATE_PATH, env_of_state, state_key, stored_manifest_path
from ..hosts.probe import MANIFEST_SCRIPT
from ..hosts.ssh import SSH, Transport

STATUSES = ("ok", "warn", "fail", "skip")
SUPPORTED_FORMATS = (1,)
# What must import in an env of each backend; anything else the script looks at is informative.
# `ddtree_engine` alone imports nothing heavy: the reference engine and the server are what the
# service loads, so they are what prove torch, transformers, safetensors and fastapi are usable.
REQUIRED_MODULES = {
    "reference": ("ddtree_engine", "ddtree_engine.reference.engine", "ddtree_engine.server.app"),
    "sglang": ("sgl_kernel", "flashinfer", "sglang", "ddtree_engine"),
}


@dataclass(frozen=True)
class ManifestCheck:
    name: str
    status: str
    reason: str
    failure_class: str | None = None

    @property
    def ok(self) -> bool:
        return self.status != "fail"


@dataclass(frozen=True)
class Manifest:
    ok: bool
    checks: tuple[ManifestCheck, ...]
    torch_version: str | None
    torch_cuda: str | None
    driver_version: str | None
    raw: dict

    @property
    def failures(self) -> tuple[ManifestCheck, ...]:
        return tuple(c for c in self.checks if not c.ok)

    def summary(self) -> str:
        if self.ok:
            torch = f"torch {self.torch_version} (CUDA {self.torch_cuda or 'none'})" if self.torch_version else "no torch"
            return f"ok: {torch}, driver {self.driver_version or 'none'}, {len(self.checks)} checks"
        first = self.failures[0]
        more = f" (+{len(self.failures) - 1} more)" if len(self.failures) > 1 else ""
        return f"{first.name}: {first.failure_class or 'failed'}: {first.reason}{more}"

    def failure_lines(self) -> list[str]:
        """One `check — reason (class)` line per failed check."""
        return [f"{c.name} — {c.reason}" + (f" ({c.failure_class})" if c.failure_class else "") for c in self.failures]


def parse_manifest(doc: object, where: str = "manifest") -> Manifest:
    """Validate the JSON of host_scripts/abi_manifest.py. Raises ConfigError naming the field."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: a manifest is a JSON object, got {type(doc).__name__}")
    if doc.get("format") not in SUPPORTED_FORMATS:
        raise ConfigError(f"{where}: manifest format {doc.get('format')!r} is not supported (expected {SUPPORTED_FORMATS})")
    if not isinstance(doc.get("ok"), bool):
        raise ConfigError(f"{where}: 'ok' must be true or false")
    raw_checks = doc.get("checks")
    if not isinstance(raw_checks, list) or not raw_checks:
        raise ConfigError(f"{where}: 'checks' must be a non-empty list")
    checks = []
    for i, c in enumerate(raw_checks):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or c.get("status") not in STATUSES:
            raise ConfigError(f"{where}: checks[{i}] needs a name and a status in {STATUSES}, got {c!r}"[:300])
        checks.append(ManifestCheck(c["name"], c["status"], str(c.get("reason") or ""), c.get("class")))
    if doc["ok"] != all(c.ok for c in checks):
        raise ConfigError(f"{where}: 'ok' is {doc['ok']} but the checks say {all(c.ok for c in checks)}: the file was edited")
    torch = doc.get("torch") or {}
    driver = doc.get("driver") or {}
    return Manifest(
        ok=doc["ok"],
        checks=tuple(checks),
        torch_version=torch.get("version"),
        torch_cuda=torch.get("cuda"),
        driver_version=driver.get("version"),
        raw=doc,
    )


def load_manifest(path: str | Path) -> Manifest:
    p = Path(path)
    try:
        return parse_manifest(json.loads(p.read_text()), str(p))
    except OSError as err:
        raise ConfigError(f"{p}: cannot read the manifest ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"{p}: the manifest is not JSON ({err.msg})") from None


def manifest_args(backend: str, pins: dict[str, str] | None = None, expect_gpu_arch: str = "auto") -> list[str]:
    """The script's arguments for an env of `backend` whose lock pins `pins`."""
    args = ["--expect-gpu-arch", expect_gpu_arch]
    for module in REQUIRED_MODULES.get(backend, ()):
        args += ["--require", module]
    if pins:
        args += ["--expect-packages", json.dumps(pins, sort_keys=True)]
    return args


def remote_command(env_python: str, args: list[str], store_in: str | None = None) -> str:
    """A shell command that reads the script from stdin into a temp file, runs it with the env's
    python (the script re-invokes itself for each import, so it needs a real path) and removes it."""
    run = " ".join(shlex.quote(a) for a in [env_python, "$f", *args]).replace("'$f'", '"$f"')
    store = f" --output {shlex.quote(store_in)}" if store_in else ""
    return f'f=$(mktemp /tmp/ddtree-abi-XXXXXX.py) && cat > "$f" && {run}{store}; rc=$?; rm -f "$f"; exit $rc'


def _parse_output(stdout: str, where: str) -> Manifest:
    try:
        doc = json.loads(stdout)
    except json.JSONDecodeError:
        raise HostError(f"{where}: the ABI manifest script printed no JSON: {stdout[-400:]!r}") from None
    try:
        return parse_manifest(doc, where)
    except ConfigError as err:
        raise HostError(str(err)) from None


def run_local(python: str, backend: str = "reference", pins: dict[str, str] | None = None, expect_gpu_arch: str = "auto", timeout_s: float = 900) -> Manifest:
    """Run the manifest script with `python` (an env on this machine, e.g. inside a container build)."""
    argv = [python, str(MANIFEST_SCRIPT), *manifest_args(backend, pins, expect_gpu_arch)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode not in (0, 1):
        raise HostError(f"the ABI manifest script exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return _parse_output(proc.stdout, f"manifest of {python}")


def run_on_host(
    host: Host,
    env_python: str,
    backend: str,
    pins: dict[str, str] | None = None,
    store_in: str | None = None,
    timeout_s: float = 900,
    transport: Transport = SSH,
) -> Manifest:
    """Run the manifest script with the env's python on `host` over SSH.

    Args:
        env_python: e.g. /opt/ddtree/envs/<hash>/bin/python.
        store_in: also write the manifest there on the host (next to the env).
        transport: the SSH seam.
    Returns:
        the parsed manifest (a failed check is in it, not raised).
    Raises:
        HostError: unreachable, or the script could not run (a failed check is not an error: see `gate`).
    """
    proc = transport.exec(
        host,
        remote_command(env_python, manifest_args(backend, pins), store_in),
        timeout_s=timeout_s,
        what="the ABI manifest",
        input_text=MANIFEST_SCRIPT.read_text(),
    )
    if proc.returncode not in (0, 1):
        raise HostError(f"host {host.name}: the ABI manifest script exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return _parse_output(proc.stdout, f"host {host.name}")


def gate(manifest: Manifest, host_name: str) -> None:
    """Raise CheckFailed (exit 1) with the reason when the env's manifest failed: deploy stops for that host."""
    if not manifest.ok:
        raise CheckFailed(f"host {host_name}: the env's ABI manifest failed — {manifest.summary()}")


# --- the manifest stored beside a host's env -----------------------------------------------------


def lock_pins(requirements: list[str] | tuple[str, ...]) -> dict[str, str]:
    """{distribution: version} of a lock's `name==version` lines, for the script's drift check."""
    pins = {}
    for line in requirements:
        name, sep, version = line.partition("==")
        if sep:
            pins[name.strip()] = version.strip()
    return pins


def stored_path(env: str) -> str:
    return stored_manifest_path(env)


@dataclass(frozen=True)
class EnvVerdict:
    """What the manifest stored beside a host's engine environment says about it."""

    host: str
    env: str | None
    status: str  # ok | failed | missing (no env, or no manifest) | invalid (unreadable manifest)
    manifest: Manifest | None = None
    problem: str | None = None  # why there is no manifest to judge

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def short(self) -> str:
        """One cell: `ok`, `failed: check, check`, `missing`, `invalid`."""
        if self.status == "failed":
            return "failed: " + ", ".join(c.name for c in self.manifest.failures)
        return self.status

    def refusal(self) -> str | None:
        """Why nothing may be deployed on this host (None when the env passed its manifest)."""
        fix = f"run `ddtree-ops provision {self.host}`"
        if self.ok:
            return None
        if self.env is None:
            return f"host {self.host!r} has no engine environment recorded in its state file: {fix}"
        if self.status == "failed":
            lines = [f"host {self.host!r}: the engine environment {self.env} failed its ABI manifest:"]
            lines += [f"  {line}" for line in self.manifest.failure_lines()]
            lines.append(f"  {fix} after fixing the environment (it re-verifies and stores the manifest)")
            return "\n".join(lines)
        if self.status == "invalid":
            return f"host {self.host!r}: {self.problem}; {fix} to verify the environment again"
        return f"host {self.host!r}: the engine environment {self.env} has no ABI manifest ({self.problem}): {fix} to verify it"

    def to_dict(self) -> dict:
        return {
            "host": self.host,
            "env": self.env,
            "status": self.status,
            "summary": self.manifest.summary() if self.manifest else self.problem,
            "failures": self.manifest.failure_lines() if self.manifest else [],
        }


def verdict_from_text(host_name: str, env: str, text: str) -> EnvVerdict:
    """Judge the stored manifest's text (empty = no file). Pure."""
    path = stored_path(env)
    if not text.strip():
        return EnvVerdict(host_name, env, "missing", problem=f"no {path}")
    try:
        manifest = parse_manifest(json.loads(text), path)
    except json.JSONDecodeError as err:
        return EnvVerdict(host_name, env, "invalid", problem=f"{path} is not JSON ({err.msg})")
    except ConfigError as err:
        return EnvVerdict(host_name, env, "invalid", problem=str(err))
    return EnvVerdict(host_name, env, "ok" if manifest.ok else "failed", manifest)


def read_env_verdict(
    host: Host, env: str | None = None, timeout_s: float = 30.0, mode: str = "venv", transport: Transport = SSH
) -> EnvVerdict:
    """Read (never run) the manifest stored beside `env`, by default the env named in the host's state.json.

    Args:
        env: the env (or image record) directory; None: the one state.json names for `mode`.
        transport: the SSH seam.
    Returns:
        the verdict (missing, invalid, failed or ok).
    Raises:
        HostError: the host did not answer over SSH.
    """
    if env is None:
        state_text = transport.run(host, f"cat {STATE_PATH} 2>/dev/null || true", timeout_s)
        try:
            env = env_of_state(json.loads(state_text), mode) if state_text.strip() else None
        except json.JSONDecodeError:
            env = None
        if env is None:
            return EnvVerdict(host.name, None, "missing", problem=f"no {state_key(mode)} recorded in {STATE_PATH}")
    return verdict_from_text(host.name, env, transport.run(host, manifest_read_command(env), timeout_s))


def manifest_read_command(env: str) -> str:
    """The shell command that prints the manifest stored beside `env` (nothing when there is none)."""
    return f"cat {shlex.quote(stored_path(env))} 2>/dev/null || true"
