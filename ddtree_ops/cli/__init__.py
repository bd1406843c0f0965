"""The `ddtree-ops` command: thin click commands that parse, call a library function, and render.

Commands are registered here, explicitly: a command module that is missing or broken fails the
import of the CLI (and so every test), instead of silently dropping its command. They are listed
in `--help` in the order they are registered, which is the order of the flow.
"""

from __future__ import annotations

import logging
import sys

import click

from . import compare, deploy, doctor, health, hosts, init_cmd, lab, provision, sweep
from .common import DdtreeGroup, config_option, with_config_option

# The order of the flow: what a new user runs first comes first in `ddtree-ops --help`.
COMMANDS: tuple[click.Command, ...] = (
    init_cmd.init,
    lab.lab,
    hosts.hosts,
    doctor.doctor,
    provision.provision,
    deploy.deploy,
    health.healthcheck,
    compare.compare,
    sweep.sweep,
    deploy.rollback,
    deploy.undeploy,
)
# Every command that reads the project file takes `-c FILE` after its name too (`init` takes it itself:
# the file it writes); `lab` makes its own project file, so it takes none; `hosts trust` takes it itself.
READS_PROJECT = ("doctor", "provision", "deploy", "healthcheck", "compare", "sweep", "rollback", "undeploy")


@click.group(cls=DdtreeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@config_option
@click.version_option(package_name="ddtree-ops")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Provision, deploy, health-check and compare DDTree speculative decoding on GPU hosts.

    Every command reads one project file: -c FILE (before or after the command name), else
    $DDTREE_CONFIG, else ./ddtree.yaml, else the default lab's. Commands are listed in the
    order of the flow; `ddtree-ops COMMAND --help` shows each one's options and examples.

    \b
    Examples:
      ddtree-ops init                          # write an annotated ./ddtree.yaml, then edit it
      ddtree-ops lab up                        # or: two local Docker hosts and their ddtree.yaml
      ddtree-ops hosts trust                   # record the hosts' SSH keys (shows their fingerprints)
      ddtree-ops doctor                        # this machine and every host: tools, SSH, probe, lock
      ddtree-ops provision --plan              # the lock each host would get; changes nothing
      ddtree-ops provision                     # build the engine env on every host
      ddtree-ops deploy --budget 15 --topk 8   # roll the services out, gated on /health
      ddtree-ops healthcheck                   # every service: unit, HTTP, a generation, acceptance
      ddtree-ops compare --runs 3              # baseline vs tree on the same prompts
      ddtree-ops sweep --budgets 8,15,31 --topks 4,8   # try budgets/topks, recommend one
      ddtree-ops doctor -c prod.yaml --hosts gpu-1,gpu-2

    \b
    Exit codes:
      0  ok
      1  a host or a check failed
      2  bad input (project file, arguments): named with its fix; no host was touched
    """
    # `obj` may arrive with seams (tests: `CliRunner().invoke(cli, args, obj={"seams": Seams(...)})`).
    ctx.ensure_object(dict)


for _command in COMMANDS:
    cli.add_command(with_config_option(_command) if _command.name in READS_PROJECT else _command)


def _log_to_stderr() -> None:
    """Library code logs through `logging`; the CLI shows INFO and above on stderr, as plain lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("ddtree_ops")
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def main() -> None:
    _log_to_stderr()
    cli()
