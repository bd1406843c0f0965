"""The five `--speculative-ddtree-*` flags, as fields of SGLang's own `ServerArgs`.

SGLang 0.5.23 builds `ServerArgs` once, at import, as a msgspec Struct from its namespace classes,
and derives the CLI from the fields (`add_cli_args_from_dataclass`). A plugin therefore cannot add
a field to it in place: `DDTreeServerArgs` subclasses it with the five fields, and the plugin's
one class REPLACE hook (`sglang.srt.server_args.ServerArgs`, see `PATCHED_TARGETS` in this
package) puts the subclass where SGLang's launcher looks it up. So `ServerArgs.add_cli_args`
registers the flags, `ServerArgs.from_cli_args` fills them, the record pickles to the scheduler
process with them, `/get_server_info` (`resolved_dict`) reports them, and `get_spec()` carries
them (they join the `spec` namespace through `_NS_PATH`).

This module imports `sglang.srt.server_args` (and so torch): the package's `register()` imports
it only after the version check.
"""

from typing import Annotated, Literal

import sglang.srt.server_args as _sglang_server_args
from sglang.srt.arg_groups.arg_utils import Arg

HYBRID_MODES = ("safe", "spine", "unsafe")

# The fields DDTreeServerArgs adds, in CLI order (the worker reads them off the record).
DDTREE_FIELDS = (
    "speculative_ddtree_budget",
    "speculative_ddtree_topk",
    "speculative_ddtree_spine_depth",
    "speculative_ddtree_hybrid_mode",
    "speculative_ddtree_allow_hybrid_unsafe",
)


def cli_flag(field: str) -> str:
    """The command-line spelling SGLang derives for a field.

    Args:
        field: a `ServerArgs` field name, e.g. "speculative_ddtree_budget".

    Returns:
        "--speculative-ddtree-budget".
    """
    return "--" + field.replace("_", "-")


# Subclassed through the module attribute, not a `from … import ServerArgs` name: the REPLACE
# hook rebinds every module-level name that holds the original class, this module's included.
class DDTreeServerArgs(_sglang_server_args.ServerArgs):
    """SGLang's `ServerArgs` plus the DDTREE fields (read by the worker as `server_args.<name>`)."""

    # namespace_of() files the annotations of a class carrying _NS_PATH under that namespace,
    # so the published `spec` config bag has these leaves too.
    _NS_PATH = "spec"

    speculative_ddtree_budget: Annotated[
        int,
        Arg(
            help="DDTREE only. Drafted tree nodes verified per step (the verify width is budget + 1). "
            "budget = block_size - 1 costs the same verify width as DFLASH.",
        ),
    ] = 15
    speculative_ddtree_topk: Annotated[
        int,
        Arg(
            help="DDTREE only. Candidate tokens kept per drafted depth (K = min(topk, budget)).",
        ),
    ] = 8
    speculative_ddtree_spine_depth: Annotated[
        int,
        Arg(
            help="DDTREE only. Reserve the drafter's top-1 chain to this depth before best-first "
            "expansion (0 = off); at most min(budget, block_size - 1).",
        ),
    ] = 0
    speculative_ddtree_hybrid_mode: Annotated[
        Literal["safe", "spine", "unsafe"],
        Arg(
            help="DDTREE only, hybrid (GDN/Mamba) targets. safe: each tree node's recurrent state comes "
            "from its parent (exact); spine: hybrid layers verify only the top-1 chain; unsafe: "
            "flattened order, reproduces sibling state leakage (diagnosis only, needs "
            "--speculative-ddtree-allow-hybrid-unsafe).",
        ),
    ] = "safe"
    speculative_ddtree_allow_hybrid_unsafe: Annotated[
        bool,
        Arg(
            help="DDTREE only. Allow --speculative-ddtree-hybrid-mode unsafe, which corrupts output on "
            "hybrid models.",
        ),
    ] = False
