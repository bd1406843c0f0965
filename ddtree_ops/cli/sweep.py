"""`ddtree-ops sweep`: try tree budgets and topks one at a time, recommend one, leave services known."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..compare.prompts import load_prompts
from ..compare.run import failure_line
from ..exceptions import CheckFailed, ConfigError
from ..sweep.execute import SweepResult, execute_sweep, fresh_state, resume_plan
from ..sweep.plan import parse_apply, parse_int_list, plan_sweep, tree_service_name
from ..sweep.report import TABLE_COLUMNS, recommendation_line, table_rows
from ..sweep.run import DRAIN_TIMEOUT_S, SweepSeams
from .common import emit_json, hosts_option, json_option, lock_timeout_option, locked, project_from, seams_from, split_names
from .render import console

DEFAULT_RUNS = 3
DEFAULT_MAX_TOKENS = 128


def _progress():
    """Progress lines on stderr through rich (a Text, so brackets in a line are never read as markup)."""
    err = Console(stderr=True, highlight=False)

    def say(line: str) -> None:
        err.print(Text.assemble(("sweep: ", "dim"), line), soft_wrap=True)

    return say


def _render(result: SweepResult) -> None:
    doc, out = result.doc, console()
    s = doc["settings"]
    table = Table(title=f"ddtree sweep: {s['tree']} vs {s['baseline']} on {', '.join(s['hosts'])} "
                  f"({s['runs']} run(s), {s['max_tokens']} max tokens, T=0, block size {s['block_size']})")  # fmt: skip
    for col in TABLE_COLUMNS:
        table.add_column(col, justify="right")
    for row in table_rows(doc["configs"]):
        row[7] = {"✓": "[green]✓[/green]", "✗": "[red]✗[/red]"}.get(row[7], row[7])
        table.add_row(*row)
    out.print(table)
    out.print(f"[bold]{recommendation_line(doc['recommendation'])}[/bold]")
    for h in doc["hosts"]:
        final = h["final"] or {}
        where = f"budget {final.get('budget')}, topk {final.get('topk')}" if final.get("budget") is not None else "an unknown configuration"
        out.print(f"{h['host']}/{s['tree']}: left on {where} (release {final.get('release_id') or '?'})")
    for w in doc["warnings"]:
        out.print(f"[yellow]warning[/yellow] {w}")
    out.print(f"report: {result.files['markdown']}, {result.files['json']}, {result.files['chart']}")


@click.command("sweep")
@click.option("--budgets", default=None, metavar="B1,B2", help="Tree budgets to try, comma-separated (e.g. 8,15,16,31).")
@click.option("--topks", default=None, metavar="K1,K2", help="Topk values to try, comma-separated (e.g. 4,8); every budget × topk is measured.")
@click.option("--services", "services_", default=None, metavar="NAME", help="The ddtree service to sweep [default: tree].")
@click.option("--baseline", default="baseline", show_default=True, help="Service name of the linear arm (never touched).")
@hosts_option
@click.option("--runs", type=click.IntRange(min=1), default=None, help=f"Measured runs per prompt per arm [default: {DEFAULT_RUNS}].")
@click.option("--max-tokens", type=click.IntRange(min=2), default=None, help=f"Completion length limit per request [default: {DEFAULT_MAX_TOKENS}].")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), default=None,
              help="A built-in set (builtin, heldout, …) or a YAML/JSON list of prompts; default: builtin.")  # fmt: skip
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, help="Report and state folder [default: ./ddtree-sweep-<timestamp>].")
@click.option("--apply", "apply_", default=None, metavar="best|BUDGET/TOPK",
              help="Deploy this configuration at the end (best: the recommendation); default: put back what ran before.")  # fmt: skip
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False), default=None,
              help="Continue the interrupted sweep in DIR; its finished configurations are not measured again.")  # fmt: skip
@click.option("--drain-timeout", type=click.FloatRange(min=0, min_open=True), default=DRAIN_TIMEOUT_S, show_default=True,
              help="Seconds to wait for a service to hold no request before redeploying it.")  # fmt: skip
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True, help="Seconds per request.")
@lock_timeout_option
@json_option
@click.pass_context
def sweep(ctx, budgets, topks, services_, baseline, hosts, runs, max_tokens, prompts_file, out_dir, apply_, resume_dir,
          drain_timeout, timeout, lock_timeout, json_):  # fmt: skip
    """Find the best tree budget and topk: redeploy the tree service with each, measure it against the baseline.

    One host at a time and one configuration at a time: drain the tree service (no request in
    flight, from its /metrics gauges), redeploy it through the health-gated deploy, wait until it
    is healthy and idle (warm), then measure it like `compare` (same prompts, alternating arms,
    usage token counts, the lossless check at T=0). The baseline is never redeployed. A host is
    put back on its configuration from before the sweep before the next host starts; with --apply
    every host gets the chosen one at the end. A failed configuration (gate failed, service
    killed) is reported with its journal tail and the sweep goes on once the service is healthy
    again; a host whose service does not come back drops out. Ctrl-C puts the service being swept
    back first; --resume DIR continues without re-measuring what finished.

    Reports in --out: sweep.json, sweep.md, sweep.png, and sweep-state.json (for --resume).

    \b
    Examples:
      ddtree-ops sweep --budgets 8,15,16,31,32,64 --topks 4,8 --runs 3 --out sweep/
      ddtree-ops sweep --budgets 15,31 --topks 8 --hosts gpu-1 --apply best --json
      ddtree-ops sweep --resume sweep/

    \b
    Exit codes:
      0  every configuration measured, every service left where it should be
      1  a service was unhealthy at the start (nothing touched), another run holds a host's lock
         (nothing touched), a configuration failed, a service could not be put back, or the
         sweep was interrupted (resume with --resume)
      2  bad input (empty list, budget < 0, topk < 1, duplicate configurations, unknown host or
         service, a tree service that is not ddtree, --resume without a sweep); nothing contacted
    """
    project = project_from(ctx)
    apply = parse_apply(apply_)
    host_names = split_names(hosts) or None
    if resume_dir:
        if out_dir and Path(out_dir) != Path(resume_dir):
            raise ConfigError(f"--out {out_dir} and --resume {resume_dir}: a resumed sweep writes into its own folder; give one")
        overrides = {
            "budgets": parse_int_list(budgets, "--budgets") if budgets is not None else None,
            "topks": parse_int_list(topks, "--topks") if topks is not None else None,
            "hosts": host_names, "runs": runs, "max_tokens": max_tokens,
            "tree": tree_service_name(split_names((services_,))) if services_ else None,
        }  # fmt: skip
        plan, prompts, state = resume_plan(project, Path(resume_dir), apply, overrides)
    else:
        if budgets is None or topks is None:
            raise ConfigError("--budgets and --topks are needed (e.g. --budgets 8,15,16 --topks 4,8), or --resume DIR")
        plan = plan_sweep(
            project, parse_int_list(budgets, "--budgets"), parse_int_list(topks, "--topks"),
            tree=tree_service_name(split_names((services_,)) if services_ else None), baseline=baseline,
            hosts=host_names, runs=runs or DEFAULT_RUNS, max_tokens=max_tokens or DEFAULT_MAX_TOKENS, apply=apply,
        )  # fmt: skip
        prompts = load_prompts(prompts_file)
        out = Path(out_dir or f"ddtree-sweep-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}")
        state = fresh_state(plan, prompts, out)
    for warning in plan.warnings:
        click.echo(f"warning: {warning}", err=True)
    seams = seams_from(ctx)
    # Every host it may redeploy is locked from its first change to its end (after the read-only preflight).
    lock = lambda hosts: locked(ctx, hosts, "sweep", lock_timeout)  # noqa: E731
    result = execute_sweep(
        plan, prompts, state, progress=_progress(),
        seams=SweepSeams(run_playbook=seams.run_playbook, transport=seams.transport, lock=lock),
        drain_timeout_s=drain_timeout, timeout_s=timeout,
    )  # fmt: skip
    if json_:
        emit_json({**result.doc, "files": {k: str(v) for k, v in result.files.items()}})
    else:
        _render(result)
    if not result.ok:
        lines = [failure_line(f).replace("\n", "\n    ") for f in result.doc["failures"]]
        raise CheckFailed("sweep failed:\n  " + "\n  ".join(lines) + f"\nreport: {result.files['markdown']}")
