"""What pip runs on a host to build an env from its lock, in order (pure: no I/O).

The role `ddtree_provision` runs these commands with the env's own pip, one after the other.
Each lock says which of these it uses (`EngineLock.install_commands`):

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

CONSTRAINTS = "constraints.txt"
REQUIREMENTS = "requirements.txt"
SOURCES = ("wheelhouse", "index")
_COMMON = ["install", "--no-cache-dir", "--disable-pip-version-check"]


def install_commands(lock, staging: str, *, source: str = "wheelhouse", engine_wheel: str | None = None) -> list[list[str]]:
    """pip argument lists (without `pip` itself), to run in order.

    Args:
        lock: any EngineLock (it decides which commands it needs).
        staging: the directory on the host where the wheelhouse was unpacked.
        source: `wheelhouse` (offline) or `index` (the host downloads; sglang locks only).
        engine_wheel: the engine wheel's file name in the wheelhouse (sglang locks).
    Returns:
        the argument lists, in order.
    Raises:
        ValueError: an unknown source, or an sglang lock without its engine wheel.
    """
    if source not in SOURCES:
        raise ValueError(f"unknown install source {source!r}: use 'wheelhouse' or 'index'")
    return lock.install_commands(staging, source=source, engine_wheel=engine_wheel)


def _offline(staging: str) -> list[str]:
    return ["--no-index", "--find-links", staging]


def reference_install_commands(staging: str) -> list[list[str]]:
    """One offline install of every pinned wheel (requirements.txt in the wheelhouse)."""
    return [[*_COMMON, *_offline(staging), "--requirement", f"{staging}/{REQUIREMENTS}"]]


def step_install_commands(steps, staging: str, *, source: str, engine_wheel: str | None) -> list[list[str]]:
    """A CudaLock's install steps in order (offline from the wheelhouse, or from their indexes), then the engine.

    Raises:
        ValueError: no engine wheel was given.
    """
    if not engine_wheel:
        raise ValueError("an sglang lock installs the engine wheel last: pass engine_wheel")
    constraints = f"{staging}/{CONSTRAINTS}"
    commands = []
    for step in steps:
        if source == "index":
            commands.append([*_COMMON, *step.pip_args(constraints)[1:]])
            continue
        args = [*_COMMON, *_offline(staging)]
        if step.no_deps:
            args.append("--no-deps")
        if step.use_constraints:
            args += ["-c", constraints]
        commands.append(args + list(step.requirements))
    commands.append([*_COMMON, *_offline(staging), "--no-deps", f"{staging}/{engine_wheel}"])
    return commands
