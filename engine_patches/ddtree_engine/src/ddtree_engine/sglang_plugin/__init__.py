"""DDTREE inside stock SGLang, as a plugin of its `sglang.srt.plugins` entry-point group.

SGLang calls `register()` early in every process (launcher, scheduler, detokenizer: its
`load_plugins()`), then applies the hooks registered through its `HookRegistry`. `register()`
refuses any SGLang but the pinned release, then, once per process:
- registers `--speculative-algorithm DDTREE` (`spec.register_algorithm`);
- registers the one patch below, which adds the five `--speculative-ddtree-*` flags.

Importing this package imports neither sglang nor torch: `register()` imports them after the
version check, and `worker` (torch, CUDA) is imported only when SGLang creates the worker.
"""

from __future__ import annotations

from importlib import metadata

from ..errors import EngineError

SUPPORTED_SGLANG_VERSION = "0.5.23"

# Every SGLang object this plugin replaces or hooks, in one place: (dotted target, hook type,
# why). tests/ddtree_engine/sglang_plugin checks that each still exists in the installed SGLang.
PATCHED_TARGETS = (
    (
        "sglang.srt.server_args.ServerArgs",
        "REPLACE",
        "flags.DDTreeServerArgs: ServerArgs plus the five --speculative-ddtree-* fields",
    ),
)

# SGLang names the plugin uses without patching them (a rename in SGLang breaks the plugin,
# so the same test resolves each).
USED_TARGETS = (
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.register",
    "sglang.srt.speculative.spec_registry.CustomSpecAlgo",
    "sglang.srt.speculative.spec_registry._assert_custom_spec_algo_conforms",
    "sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding",
    "sglang.srt.arg_groups.speculative_hook._handle_dflash",
    "sglang.srt.arg_groups.overrides._ForeignDefaults",
    "sglang.srt.arg_groups.overrides.record_foreign_defaults",
    "sglang.srt.arg_groups.overrides.declare_resolution",
    "sglang.srt.arg_groups.overrides.record_of",
    "sglang.srt.arg_groups.arg_utils.namespace_of",
    "sglang.srt.speculative.ragged_verify.read_ragged_verify_mode",
    "sglang.srt.plugins.hook_registry.HookRegistry.register",
)

_registered = False


class SGLangVersionError(EngineError, RuntimeError):
    """The installed SGLang is not the release this plugin is written against (exit code 2)."""

    exit_code = 2


def installed_sglang_version() -> str | None:
    """The installed `sglang` distribution's version, or None when it is not installed."""
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def check_sglang_version() -> str:
    """Refuse any SGLang but the pinned release.

    Returns:
        The installed version (== SUPPORTED_SGLANG_VERSION).

    Raises:
        SGLangVersionError: saying what was found, what is supported, and how to fix it.
    """
    found = installed_sglang_version()
    if found == SUPPORTED_SGLANG_VERSION:
        return found
    what = "sglang is not installed" if found is None else f"sglang {found} is installed"
    raise SGLangVersionError(
        f"ddtree_engine's SGLang plugin (DDTREE) refuses to load: {what}, and it supports only "
        f"sglang {SUPPORTED_SGLANG_VERSION} (it subclasses SGLang's ServerArgs and rides its "
        f"DFLASH worker, which change between releases). Install sglang=={SUPPORTED_SGLANG_VERSION} "
        "(ddtree-ops provision pins it), or uninstall ddtree-engine from this environment, or run "
        "SGLang with SGLANG_PLUGINS set to a list without 'ddtree' to skip this plugin."
    )


def rebind_engine_server_args(replacement: type) -> bool:
    """Point `sglang.Engine.server_args_class` at the replacement class, when the engine is loaded.

    The REPLACE hook rebinds module-level names, not class attributes; `Engine.server_args_class`
    would keep the original class, and an `sgl.Engine(...)` record of it no longer pickles to the
    scheduler ("not the same object as sglang.srt.server_args.ServerArgs"; seen on the H200 with
    the plugin installed and a plain AR engine). `Engine.__init__` calls `load_plugins()` first,
    so its module is always loaded when that path runs.

    Args:
        replacement: the class now at `sglang.srt.server_args.ServerArgs`.

    Returns:
        True when the attribute was rebound.
    """
    import sys

    engine_module = sys.modules.get("sglang.srt.entrypoints.engine")
    engine = getattr(engine_module, "Engine", None)
    current = getattr(engine, "server_args_class", None)
    if engine is None or current is replacement or not (isinstance(current, type) and issubclass(replacement, current)):
        return False
    engine.server_args_class = replacement
    return True


def register() -> None:
    """The `sglang.srt.plugins` entry point: check the version, then register DDTREE once.

    Idempotent within a process (SGLang's registry refuses a second registration of a name, and
    a second REPLACE hook would only add a warning). SGLang logs what this raises as a failed
    plugin; `--speculative-algorithm DDTREE` is then unknown to it.

    Raises:
        SGLangVersionError: the installed SGLang is not SUPPORTED_SGLANG_VERSION.
    """
    global _registered
    check_sglang_version()
    if _registered:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.speculative.spec_registry import get_spec

    from .flags import DDTreeServerArgs
    from .spec import ALGORITHM, register_algorithm

    hooks = {"sglang.srt.server_args.ServerArgs": DDTreeServerArgs}
    if {target for target, _, _ in PATCHED_TARGETS} != set(hooks):
        raise RuntimeError("PATCHED_TARGETS and the hooks register() installs disagree")
    for target, hook_type, _why in PATCHED_TARGETS:
        HookRegistry.register(target, hooks[target], getattr(HookType, hook_type))
    rebind_engine_server_args(DDTreeServerArgs)
    if get_spec(ALGORITHM) is None:
        register_algorithm()
    _registered = True
