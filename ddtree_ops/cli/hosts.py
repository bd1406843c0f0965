"""`ddtree-ops hosts trust [HOST…] [--replace] [--json]`: record the hosts' SSH keys in the project's known_hosts."""

from __future__ import annotations

import click

from ..hosts.trust import trust_hosts
from .common import InOrderGroup, config_option, emit_json, json_option, project_from, split_names


@click.group(
    cls=InOrderGroup,
    epilog="""\b
Examples:
  ddtree-ops hosts trust                   # record every host's SSH keys (their fingerprints are shown)
  ddtree-ops hosts trust gpu-1 --replace   # gpu-1 was re-keyed: record its new keys

\b
Exit codes:
  0  done
  1  a host did not answer, or offers other keys than recorded (and no --replace)
  2  bad input (project file, unknown host): no host was contacted
""",
)
def hosts() -> None:
    """The project's hosts: which SSH host keys ddtree-ops accepts from them.

    Every SSH connection checks the host's key against the project's known_hosts file
    (`ssh.known_hosts` in the project file, default: `known_hosts` beside it); a host whose
    key is missing or changed is refused, and nothing runs on it.
    """


@hosts.command(
    epilog="""\b
Examples:
  ddtree-ops hosts trust                   # every host in the project file
  ddtree-ops hosts trust gpu-1 gpu-2
  ddtree-ops hosts trust gpu-1 --replace   # gpu-1 was re-keyed (reinstalled): record its new key
  ddtree-ops -c prod.yaml hosts trust --json

\b
Exit codes:
  0  every host's keys are recorded (new or unchanged)
  1  a host did not answer, or offers other keys than recorded (and no --replace): nothing written for it
  2  bad input (project file, unknown host): no host was contacted
"""
)
@config_option
@click.argument("names", nargs=-1, metavar="[HOST]...")
@click.option("--hosts", "hosts_", multiple=True, metavar="H1,H2", help="The same as naming hosts as arguments.")
@click.option("--replace", is_flag=True, help="Replace a host's recorded keys when it offers others (after you confirmed them).")
@json_option
@click.pass_context
def trust(ctx: click.Context, names: tuple[str, ...], hosts_: tuple[str, ...], replace: bool, json_: bool) -> None:
    """Fetch each host's SSH keys (ssh-keyscan), print their SHA256 fingerprints, and record them.

    Trust on first use, made explicit: compare the fingerprints with the host's console
    (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` there) when it matters. A host
    already recorded with other keys is refused unless --replace; --replace removes that
    host's old entries only.
    """
    project = project_from(ctx, api_key=False)  # trusting host keys needs no API key
    # unknown names: ConfigError (exit 2) naming the known ones, before any host is contacted
    selected = project.select_hosts(split_names(names + hosts_))
    results = trust_hosts(selected, replace=replace)
    failures = [{"host": r.host, "service": None, "message": r.error or r.status} for r in results if not r.ok]
    if json_:
        emit_json({"ok": not failures, "failures": failures, "hosts": [r.to_dict() for r in results]})
    else:
        for r in results:
            click.echo(f"{r.host}  {r.pattern}  {r.status}  ({r.known_hosts})")
            for key in r.keys:
                click.echo(f"    {key.fingerprint}  {key.key_type}")
            for key in r.previous:
                click.echo(f"    was {key.fingerprint}  {key.key_type}")
            if r.error:
                click.echo(f"error: {r.error}", err=True)
        recorded = sum(r.ok for r in results)
        click.echo(f"hosts trust: {recorded} of {len(results)} host(s) recorded", err=True)
    ctx.exit(1 if failures else 0)
