"""Options `generate` and `serve` share: which models, which algorithm, how to speculate."""

from __future__ import annotations

import os

import click

from .errors import BadInputError
from .types import ALGORITHMS, HYBRID_MODES, SpeculativeConfig, validate_spec

DTYPES = ("auto", "float32", "float64", "bfloat16", "float16")


def _model_location(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and value != "lab" and not os.path.isdir(os.path.expanduser(value)):
        raise click.BadParameter(f"{value!r} is not a directory; pass a Hugging Face model directory or 'lab'")
    return value


def spec_options(f):
    """Decorate a command with the model and speculation options (they arrive as keyword args)."""
    options = [
        click.option("--target", required=True, callback=_model_location, help="Target model: HF directory or 'lab'."),
        click.option(
            "--draft", default=None, callback=_model_location,
            help="DFlash drafter: HF directory or 'lab' (not needed for ar).",
        ),
        click.option("--algorithm", type=click.Choice(ALGORITHMS), default="ddtree", show_default=True),
        click.option(
            "--budget", type=click.IntRange(min=0), default=15, show_default=True,
            help="Drafted tree nodes per verify (ddtree); verify width = budget + 1.",
        ),
        click.option("--topk", type=click.IntRange(min=1), default=8, show_default=True, help="Candidates per depth."),
        click.option(
            "--spine-depth", type=click.IntRange(min=0), default=0, show_default=True,
            help="Reserve the top-1 chain to this depth first (ddtree).",
        ),
        click.option(
            "--hybrid-mode", type=click.Choice(HYBRID_MODES), default="safe", show_default=True,
            help="Recurrent-state handling on hybrid (Gated-DeltaNet) targets.",
        ),
        click.option("--allow-hybrid-unsafe", is_flag=True, help="Permit --hybrid-mode unsafe (diagnosis only: it leaks state)."),
        click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N."),
        click.option("--dtype", type=click.Choice(DTYPES), default="auto", show_default=True),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def spec_from_options(algorithm, budget, topk, spine_depth, hybrid_mode, allow_hybrid_unsafe, draft) -> SpeculativeConfig:
    """The SpeculativeConfig, checked by the engine's own rules before any model loads (usage error, exit 2)."""
    if algorithm != "ar" and draft is None:
        raise click.UsageError(f"--algorithm {algorithm} needs --draft DIR (or 'lab')")
    spec = SpeculativeConfig(
        algorithm=algorithm, budget=budget, topk=topk, spine_depth=spine_depth,
        hybrid_mode=hybrid_mode, allow_hybrid_unsafe=allow_hybrid_unsafe,
    )
    try:
        validate_spec(spec, drafter=object() if draft is not None else None)
    except BadInputError as exc:
        raise click.UsageError(str(exc)) from exc
    return spec
