"""`provision --plan`: the lock each host would get (or why it would be refused), changing nothing.

Facts come from a live probe over SSH or from a recorded probe file, so an operator can plan for a
host they cannot reach yet. Different hosts may get different locks; `render_side_by_side` shows them
in one table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .config import Host, Project
from .exceptions import ConfigError, HostError
from .probe import HostFacts, load_facts, probe_host
from .resolve import CudaLock, Refusal, requested_attention_backend, resolve


@dataclass(frozen=True)
class PlanResult:
    host: str
    facts_source: str  # "probe over SSH" | the facts file's path
    facts: HostFacts | None
    lock: CudaLock | object | None  # CudaLock (sglang) or lock.Lock (reference)
    refusal: Refusal | None
    error: str | None = None  # the probe itself failed (unreachable host)

    @property
    def ok(self) -> bool:
        return self.lock is not None

    def to_dict(self) -> dict:
        return {
            "host": self.host,
            "facts_source": self.facts_source,
            "ok": self.ok,
            "lock": self.lock.to_dict() if self.lock is not None else None,
            "refusal": self.refusal.to_dict() if self.refusal else None,
            "error": self.error,
            "facts": self.facts.to_dict() if self.facts else None,
        }


def engine_release(project: Project) -> str | None:
    """The SGLang release the project asks for (engine.sglang_version when the schema has it)."""
    return getattr(project.engine, "sglang_version", None)


def attention_backend_for(project: Project, host: Host) -> str | None:
    wanted = {requested_attention_backend(s.extra_args) for s in project.services if host in project.hosts_of(s)}
    wanted.discard(None)
    return sorted(wanted)[0] if wanted else None


def plan_provision(project: Project, host: Host, facts: HostFacts, facts_source: str = "probe over SSH", target_archs: tuple[str, ...] = ()) -> PlanResult:
    """The lock `provision` would install on `host` given `facts`, or the refusal. Touches nothing.

    Raises:
        ConfigError: bad arguments (unknown release or architecture).
    """
    if project.engine.backend == "sglang":
        from .wheelhouse import engine_source_digest, engine_source_dir

        def lock_for(facts_used: HostFacts):
            return resolve(
                facts_used,
                host.name,
                release=engine_release(project),
                engine_source=engine_source_digest(engine_source_dir()),
                target_archs=target_archs,
                attention_backend=attention_backend_for(project, host),
                flashinfer_jit_cache=project.engine.install.flashinfer_jit_cache,
            )

        if project.engine.install.mode == "container":
            facts = _as_in_the_image(project, facts, lock_for)
        result = lock_for(facts)
        if isinstance(result, Refusal):
            return PlanResult(host.name, facts_source, facts, None, result)
        return PlanResult(host.name, facts_source, facts, result, None)
    from .lock import resolve_lock

    legacy_facts = {"python_version": facts.python_version, "architecture": facts.machine}
    if project.engine.install.mode == "container":
        from .container import base_python_version

        legacy_facts["python_version"] = base_python_version()  # the env lives in the image
    return PlanResult(host.name, facts_source, facts, resolve_lock(project, host, legacy_facts), None)


def _as_in_the_image(project: Project, facts: HostFacts, lock_for) -> HostFacts:
    """Container mode: the env lives in the image, so the image's Python (and glibc) decide the wheels,
    not the host's. The flavour, and so the base image, depends on the driver and GPUs only: it is chosen
    first with a Python the release supports."""
    import dataclasses

    from .container import base_image, image_python_version
    from .resolve import CudaLock, release_data

    _, rel = release_data(engine_release(project))
    first = lock_for(dataclasses.replace(facts, python_version=rel["python"]["min"], glibc=None))
    python = image_python_version(base_image(first)) if isinstance(first, CudaLock) else None
    return dataclasses.replace(facts, python_version=python, glibc=None) if python else facts


def plan_hosts(
    project: Project,
    hosts: list[Host],
    facts_file: str | None = None,
    target_archs: tuple[str, ...] = (),
    probe: Callable[[Host], HostFacts] = probe_host,
) -> list[PlanResult]:
    """Plan every host: from `facts_file` (one host only) or a live probe of each. Unreachable hosts
    become a PlanResult with `error`, so one dead host does not hide the others' plans."""
    if facts_file and len(hosts) != 1:
        raise ConfigError(f"--facts {facts_file} describes one host: name it (provision HOST --plan --facts FILE)")
    recorded = load_facts(facts_file) if facts_file else None  # ConfigError first: bad input before any host
    results = []
    for host in hosts:
        if recorded is not None:
            results.append(plan_provision(project, host, recorded, facts_file, target_archs))
            continue
        try:
            facts = probe(host)
        except HostError as err:
            results.append(PlanResult(host.name, "probe over SSH", None, None, None, str(err)))
            continue
        results.append(plan_provision(project, host, facts, "probe over SSH", target_archs))
    return results


def _lock_rows(lock) -> dict[str, str]:
    if isinstance(lock, CudaLock):
        return {
            "backend": "sglang " + lock.sglang_version,
            "CUDA flavour": f"{lock.cuda_flavour} ({lock.driver_mode})",
            "torch": lock.pin("torch") or "",
            "kernel": lock.pin("sglang-kernel") or lock.pin("sgl-kernel") or "",
            "flashinfer": lock.pin("flashinfer-python") or "",
            "python": lock.python_tag,
            "GPU archs": ", ".join(lock.gpu_archs),
            "attention": lock.attention_backend or "",
            "constraints": f"{len(lock.pins)} pins",
            "env": lock.short_hash if not lock.blockers else f"{lock.short_hash} (not installable)",
        }
    d = lock.to_dict()
    return {"backend": d.get("backend", ""), "python": d.get("python_tag", ""), "platform": d.get("platform", ""), "env": d.get("short_hash", "")}


def render_side_by_side(results: list[PlanResult]) -> str:
    """A plain-text table, one column per host; refusals and warnings listed under it."""
    columns = []
    for r in results:
        if r.lock is not None:
            columns.append((r.host, _lock_rows(r.lock)))
        else:
            columns.append((r.host, {"backend": "REFUSED" if r.refusal else "UNREACHABLE"}))
    keys: list[str] = []
    for _, rows in columns:
        keys += [k for k in rows if k not in keys]
    widths = [max(len(k) for k in keys)] + [max(len(h), *(len(rows.get(k, "")) for k in keys)) for h, rows in columns]
    lines = ["  ".join([" " * widths[0]] + [h.ljust(w) for (h, _), w in zip(columns, widths[1:])])]
    for k in keys:
        lines.append("  ".join([k.ljust(widths[0])] + [rows.get(k, "").ljust(w) for (_, rows), w in zip(columns, widths[1:])]))
    notes = []
    for r in results:
        if r.refusal:
            notes += [f"{r.host}: refused: {reason.message}" for reason in r.refusal.reasons]
        if r.error:
            notes.append(f"{r.host}: {r.error}")
        if isinstance(r.lock, CudaLock):
            notes += [f"{r.host}: warning: {w}" for w in r.lock.warnings]
            notes += [f"{r.host}: not installable: {b}" for b in r.lock.blockers]
    return "\n".join(lines + ([""] + notes if notes else []))


def plan_exit_code(results: list[PlanResult]) -> int:
    """0 when every host has a lock, 1 when one is refused or unreachable."""
    return 0 if all(r.ok for r in results) else 1


def plan_document(results: list[PlanResult]) -> dict:
    return {"ok": all(r.ok for r in results), "hosts": [r.to_dict() for r in results]}


def lock_for_provision(project: Project, host: Host, facts: HostFacts | None = None):
    """The lock `provision` installs on `host` (probing it when `facts` is None).

    Raises:
        HostError: the host refuses a lock (the refusal's reasons and fixes) or is unreachable.
        ConfigError: bad settings (unknown release).
    """
    facts = facts or probe_host(host, python=project.engine.install.python)
    result = plan_provision(project, host, facts)
    if result.refusal:
        raise HostError(f"host {host.name}: no environment can be built: {result.refusal.message}")
    return result.lock


__all__ = ["PlanResult", "plan_provision", "plan_hosts", "render_side_by_side", "plan_document", "plan_exit_code", "lock_for_provision"]
