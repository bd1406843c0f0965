"""`ddtree-engine`: make-tiny-pair, generate, serve. Thin: parse, call, render."""

from __future__ import annotations

import json
import sys

import click

from .cli_options import spec_from_options, spec_options
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


@click.group(cls=EngineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ddtree-engine")
def cli() -> None:
    """DDTree speculative decoding engine (reference backend on Hugging Face transformers)."""


@cli.command("make-tiny-pair")
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--arch", type=click.Choice(["qwen3", "qwen3-next"]), default="qwen3", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--block-size", type=int, default=16, show_default=True)
def make_tiny_pair_cmd(out: str, arch: str, seed: int, block_size: int) -> None:
    """Write a tiny random target (OUT/target) and matching DFlash drafter (OUT/draft)."""
    from .reference.tiny import make_tiny_pair  # deferred like load_engine below: torch, transformers

    if block_size < 2:
        raise click.BadParameter(f"must be >= 2 (anchor + drafts), got {block_size}", param_hint="--block-size")
    target, draft = make_tiny_pair(out, arch, seed, block_size)
    click.echo(json.dumps({"target": str(target), "draft": str(draft), "arch": arch, "seed": seed}))


def parse_prompt_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {text!r}", param_hint="--prompt-ids") from None
    if not ids:
        raise click.BadParameter("no token ids given", param_hint="--prompt-ids")
    return ids


@cli.command()
@spec_options
@click.option("--prompt", default=None, help="Prompt text (tokenised with the target's tokenizer).")
@click.option("--prompt-ids", default=None, help="Prompt as comma-separated token ids.")
@click.option("--chat", is_flag=True, help="Wrap --prompt in the chat template as a user message.")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("json_", "--json", is_flag=True, help="Print one JSON object.")
def generate(target, draft, algorithm, budget, topk, spine_depth, hybrid_mode, allow_hybrid_unsafe, device, dtype,
             prompt, prompt_ids, chat, max_new_tokens, temperature, seed, json_):
    """Generate once and print the tokens (and acceptance per verify step)."""
    # Deferred on purpose: the backend pulls in torch and transformers (seconds), which --help,
    # argument errors and `serve`'s own start-up (it loads in a background thread) do without.
    from .reference.engine import load_engine

    if (prompt is None) == (prompt_ids is None):
        raise click.UsageError("give exactly one of --prompt TEXT or --prompt-ids 1,2,3")
    if max_new_tokens < 1:
        raise click.BadParameter(f"must be >= 1, got {max_new_tokens}", param_hint="--max-new-tokens")
    if temperature < 0:
        raise click.BadParameter(f"must be >= 0, got {temperature}", param_hint="--temperature")
    ids = parse_prompt_ids(prompt_ids) if prompt_ids is not None else None
    spec = spec_from_options(algorithm, budget, topk, spine_depth, hybrid_mode, allow_hybrid_unsafe, draft)
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
        }))
    else:
        click.echo(text)
        steps = result.verify_steps
        mean = sum(result.accepted_per_step) / steps if steps else 0.0
        click.echo(f"[{len(result.token_ids)} tokens, {steps} verify steps, {mean:.2f} tokens/step]", err=True)


cli.add_command(serve)


def main() -> None:
    cli()


if __name__ == "__main__":
    sys.exit(main())
