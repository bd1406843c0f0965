"""What pip runs on a host to build an env from its lock, in order (pure: no I/O).

The role `ddtree_provision` runs these commands with the env's own pip, one after the other.

- reference lock: one install of every pinned wheel from the wheelhouse, offline.
- sglang lock (CudaLock), `engine.install.source: wheelhouse` (air-gapped hosts): the lock's own
  steps (torch first, the kernel wheels `--no-deps`, then SGLang under the frozen constraints), each
  offline from the wheelhouse the control node downloaded for the host's platform; then the engine.
- sglang lock, `source: index`: the same steps against their package indexes, from the host itself;
  only the engine wheel and the constraints file come from the control node.

The engine wheel always goes in last with `--no-deps`: its requirements are part of the lock
(the frozen closure resolves them together with SGLang's), and `pip check` follows.
"""

from __future__ import annotations

from .resolve import CudaLock

CONSTRAINTS = "constraints.txt"
REQUIREMENTS = "requirements.txt"


def install_commands(lock, staging: str, *, source: str = "wheelhouse", engine_wheel: str | None = None) -> list[list[str]]:
    """pip argument lists (without `pip` itself), to run in order.

    Args:
        lock: a reference Lock or a CudaLock.
        staging: the directory on the host where the wheelhouse was unpacked.
        source: `wheelhouse` (offline) or `index` (the host downloads; sglang locks only).
        engine_wheel: the engine wheel's file name in the wheelhouse (sglang locks).
    Raises:
        ValueError: an unknown source, or an sglang lock without its engine wheel.
    """
    if source not in ("wheelhouse", "index"):
        raise ValueError(f"unknown install source {source!r}: use 'wheelhouse' or 'index'")
    common = ["install", "--no-cache-dir", "--disable-pip-version-check"]
    offline = ["--no-index", "--find-links", staging]
    if not isinstance(lock, CudaLock):
        return [[*common, *offline, "--requirement", f"{staging}/{REQUIREMENTS}"]]
    if not engine_wheel:
        raise ValueError("an sglang lock installs the engine wheel last: pass engine_wheel")
    constraints = f"{staging}/{CONSTRAINTS}"
    commands = []
    for step in lock.steps:
        if source == "index":
            commands.append([*common, *step.pip_args(constraints)[1:]])
            continue
        args = [*common, *offline]
        if step.no_deps:
            args.append("--no-deps")
        if step.use_constraints:
            args += ["-c", constraints]
        commands.append(args + list(step.requirements))
    commands.append([*common, *offline, "--no-deps", f"{staging}/{engine_wheel}"])
    return commands
