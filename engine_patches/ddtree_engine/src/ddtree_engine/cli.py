"""`ddtree-engine`: make-tiny-pair, generate, serve. Thin: parse, call, render."""

from __future__ import annotations

import json
import sys

import click

from .cli_options import help_epilog, lab_pair_note, spec_from_options, spec_options
from .errors import EngineError
from .server.command import serve
from .types import Engine, SamplingParams


class EngineGroup(click.Group):
    """Turns engine errors into one message on stderr and their exit code (2 = bad input)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except EngineError as err:
            click.echo(f"error: {err}", err=True)
            ctx.exit(err.exit_code)

    def list_commands(self, ctx: click.Context) -> list[str]:
        # The order a new user meets them in, not alphabetical.
        order = {name: i for i, name in enumerate(COMMAND_ORDER)}
        return sorted(self.commands, key=lambda name: (order.get(name, len(order)), name))


COMMAND_ORDER = ("generate", "serve", "make-tiny-pair")


@click.group(
    cls=EngineGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=help_epilog(
        'ddtree-engine generate --target lab --draft lab --chat --prompt "What is 17+25? Answer with the number only."',
        "ddtree-engine serve --target lab --draft lab --port 8000",
        "ddtree-engine make-tiny-pair ./tiny --arch qwen3-next",
    ),
)
@click.version_option(package_name="ddtree-engine")
def cli() -> None:
    """DDTree speculative decoding engine (reference backend on Hugging Face transformers)."""


@cli.command(
    "make-tiny-pair",
    epilog=help_epilog(
        "ddtree-engine make-tiny-pair ./tiny",
        "ddtree-engine make-tiny-pair ./tiny-hybrid --arch qwen3-next --seed 1 --block-size 8",
    ),
)
@click.argument("out", type=click.Path(file_okay=False))
@click.option(
    "--arch", type=click.Choice(["qwen3", "qwen3-next", "qwen3.5"]), default="qwen3", show_default=True,
    help="qwen3: attention only; qwen3-next: hybrid (Gated-DeltaNet and attention layers); "
    "qwen3.5: the same hybrid as dense Qwen3.5 (qwen3_5_text), the layout SGLang loads.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random weights.")
@click.option(
    "--block-size", type=int, default=16, show_default=True,
    help="The drafter's block size (anchor + drafted positions), at least 2.",
)
def make_tiny_pair_cmd(out: str, arch: str, seed: int, block_size: int) -> None:
    """Write a tiny random target (OUT/target) and matching DFlash drafter (OUT/draft).

    Randomly initialised, for tests: they are lossless but do not speculate well.
    """
    from .reference.tiny import make_tiny_pair  # deferred like load_engine below: torch, transformers

    if block_size < 2:
        raise click.BadParameter(f"must be >= 2 (anchor + drafts), got {block_size}", param_hint="--block-size")
    target, draft = make_tiny_pair(out, arch, seed, block_size)
    click.echo(json.dumps({"target": str(target), "draft": str(draft), "arch": arch, "seed": seed}, indent=2))


def parse_prompt_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {text!r}", param_hint="--prompt-ids") from None
    if not ids:
        raise click.BadParameter("no token ids given", param_hint="--prompt-ids")
    return ids


# Longer runs list the first values on stderr and leave the whole list to --json.
STEPS_SHOWN = 32


def acceptance_line(accepted_per_step: list[int]) -> str:
    """The per-step acceptance `generate` prints after the text.

    Args:
        accepted_per_step: tokens committed by each verify step (accepted drafts + the bonus).

    Returns:
        One line, e.g. `steps: 3, accepted per step: 7 3 5, mean 5.00 (committed tokens per
        verify step, prefill excluded)`.
    """
    steps = len(accepted_per_step)
    if not steps:
        return "steps: 0 (the first token came from the prefill and generation stopped there)"
    shown = " ".join(str(n) for n in accepted_per_step[:STEPS_SHOWN])
    if steps > STEPS_SHOWN:
        shown += f" … (+{steps - STEPS_SHOWN} more in --json)"
    mean = sum(accepted_per_step) / steps
    return (
        f"steps: {steps}, accepted per step: {shown}, mean {mean:.2f} "
        "(committed tokens per verify step, prefill excluded)"
    )


@cli.command(
    epilog=help_epilog(
        'ddtree-engine generate --target lab --draft lab --chat --prompt "What is 17+25? Answer with the number only."',
        'ddtree-engine generate --target lab --draft lab --chat --prompt "Write a short paragraph about why '
        'the sky is blue." --algorithm dflash --json',
        "ddtree-engine generate --target ./tiny/target --draft ./tiny/draft --prompt-ids 1,2,3 "
        "--budget 7 --topk 4 --device cpu",
    ),
)
@spec_options
@click.option("--prompt", default=None, help="Prompt text (tokenised with the target's tokenizer).")
@click.option("--prompt-ids", default=None, help="Prompt as comma-separated token ids (used as given).")
@click.option(
    "--chat", is_flag=True, help="Wrap --prompt in the chat template as a user message (not with --prompt-ids)."
)
@click.option(
    "--max-new-tokens", type=click.IntRange(min=1), default=64, show_default=True,
    help="Stop after this many generated tokens (or earlier at the end-of-sequence token).",
)
@click.option(
    "--temperature", type=float, default=0.0, show_default=True,
    help="0: greedy (argmax); above 0: sample, still lossless against the target alone.",
)
@click.option("--seed", type=int, default=None, help="Seed for sampling at temperature > 0 [default: random].")
@click.option("json_", "--json", is_flag=True, help="Print one JSON document (tokens, text, per-step acceptance).")
def generate(target, draft, algorithm, budget, topk, spine_depth, hybrid_mode, allow_hybrid_unsafe, device, dtype,
             prompt, prompt_ids, chat, max_new_tokens, temperature, seed, json_):
    """Generate once: the text on stdout, the acceptance per verify step on stderr.

    Each verify step commits its accepted drafts plus one bonus token; the first token comes
    from the prefill and is not counted in any step. With --json everything goes to stdout.
    """
    # Deferred on purpose: the backend pulls in torch and transformers (seconds), which --help,
    # argument errors and `serve`'s own start-up (it loads in a background thread) do without.
    from .reference.engine import load_engine

    if (prompt is None) == (prompt_ids is None):
        raise click.UsageError("give exactly one of --prompt TEXT or --prompt-ids 1,2,3")
    if chat and prompt_ids is not None:
        raise click.UsageError(
            "--chat wraps --prompt TEXT in the chat template; --prompt-ids are used as given: "
            "drop --chat, or pass the text with --prompt"
        )
    if temperature < 0:
        raise click.BadParameter(f"must be >= 0, got {temperature}", param_hint="--temperature")
    ids = parse_prompt_ids(prompt_ids) if prompt_ids is not None else None
    spec = spec_from_options(algorithm, budget, topk, spine_depth, hybrid_mode, allow_hybrid_unsafe, draft)
    note = lab_pair_note(target, chat=chat if ids is None else None)
    if note:
        click.echo(note, err=True)
    engine: Engine = load_engine(target, draft, spec, device=device, dtype=dtype)
    if ids is None:
        if chat:
            ids = engine.chat_prompt_ids([{"role": "user", "content": prompt}])
        else:
            ids = engine.tokenizer.encode(prompt)
    result = engine.generate(ids, SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed))
    text = engine.tokenizer.decode(result.token_ids, skip_special_tokens=True)
    if json_:
        click.echo(json.dumps({
            "algorithm": algorithm,
            "prompt_ids": ids,
            "token_ids": result.token_ids,
            "text": text,
            "finish_reason": result.finish_reason,
            "steps": result.verify_steps,
            "accepted_per_step": result.accepted_per_step,
            "tokens_per_step": (sum(result.accepted_per_step) / result.verify_steps) if result.verify_steps else None,
        }, indent=2))
    else:
        click.echo(text)
        click.echo(
            f"{len(result.token_ids)} tokens (1 from the prefill), finish reason {result.finish_reason}", err=True
        )
        click.echo(acceptance_line(result.accepted_per_step), err=True)


cli.add_command(serve)


def main() -> None:
    cli()


if __name__ == "__main__":
    sys.exit(main())
