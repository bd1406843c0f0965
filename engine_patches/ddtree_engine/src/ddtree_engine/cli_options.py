"""What `generate` and `serve` share: the model and speculation options, the help epilog, and
the note printed when the built-in lab pair answers."""

from __future__ import annotations

import os

import click

from .errors import BadInputError
from .types import ALGORITHMS, HYBRID_MODES, SpeculativeConfig, validate_spec

DTYPES = ("auto", "float32", "float64", "bfloat16", "float16")

# What the engine's commands really return: click's usage errors and the engine's BadInputError /
# ModelLoadError exit 2, any other EngineError (and an unexpected exception) 1.
EXIT_CODES = "Exit codes: 0 ok, 1 failed, 2 bad usage or a model that does not load."

# The built-in lab pair (lab_models/), as training/corpus.py built its corpus: ChatML user turns
# from these prompt families only. The engine does not import the training code or ddtree_ops;
# tests/ddtree_engine/test_cli.py checks these figures against the corpus and the shipped weights.
LAB_TARGET_PARAMS = "4.1M"
LAB_PAIR_TEMPLATES = (
    "Python functions",
    "'What is A+B?'",
    "step-by-step sums",
    "JSON age+1",
    "a paragraph on 5 topics",
)


def lab_pair_note(target: str | None, chat: bool | None = None) -> str | None:
    """The one-line note shown whenever the built-in lab target answers, or None for other targets.

    The lab target is a toy: outside its training prompts it answers with memorised training
    text, and outside a chat turn it often stops at once. The note says so instead of guessing
    per prompt whether it is "in domain".

    Args:
        target: the `--target` value.
        chat: whether the prompt was wrapped in the chat template; False adds a hint to pass
            `--chat`, None (a server: each request decides) adds nothing.

    Returns:
        The note, or None when the target is not the lab pair.
    """
    if target != "lab":
        return None
    note = (
        f"note: the lab pair is a {LAB_TARGET_PARAMS}-parameter toy trained only on chat turns from "
        f"{len(LAB_PAIR_TEMPLATES)} templates ({', '.join(LAB_PAIR_TEMPLATES)}); "
        "other prompts get memorised training text"
    )
    if chat is False:
        note += "; add --chat, it never saw a prompt outside a chat turn"
    return note


def help_epilog(*examples: str) -> str:
    """The `Examples:` block and the exit-code line that end every engine command's `--help`.

    Args:
        examples: one command line each, shown as written (click does not rewrap them).

    Returns:
        Epilog text for `click.command(epilog=...)`.
    """
    lines = "\n".join(f"  {e}" for e in examples)
    return f"\b\nExamples:\n{lines}\n\n{EXIT_CODES}"


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
        click.option(
            "--algorithm", type=click.Choice(ALGORITHMS), default="ddtree", show_default=True,
            help="ar: target alone; dflash: verify the drafter's chain; ddtree: verify a draft tree.",
        ),
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
        click.option(
            "--dtype", type=click.Choice(DTYPES), default="auto", show_default=True,
            help="Weights and compute dtype; auto is bfloat16 on CUDA, float32 on the CPU.",
        ),
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
