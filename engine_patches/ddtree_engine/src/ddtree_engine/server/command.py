"""`ddtree-engine serve`: parse options, check the port, run uvicorn over the app."""

from __future__ import annotations

import errno
import logging
import socket
import sys

import click

from ..cli_options import spec_from_options, spec_options
from ..types import Engine
from .app import ServerSettings, create_app, served_model_name_for

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


class PortInUse(click.UsageError):
    """Exit 2: the address is taken, nothing was loaded."""


def bind_listen_socket(host: str, port: int) -> socket.socket:
    """Bind `host:port` now, so a taken port fails before the model loads and no race is left.

    Raises:
        PortInUse: the port is held by another process (message says how to find it).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # uvicorn sets SO_REUSEADDR too: a port in TIME_WAIT is free, a listening one is not.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(
                f"port {port} on {host} is already in use: stop what holds it "
                f"(ss -ltnp 'sport = :{port}') or pass --port"
            ) from exc
        raise click.UsageError(f"cannot bind {host}:{port}: {exc.strerror}; check --host and --port") from exc
    sock.set_inheritable(True)
    return sock


@click.command()
@spec_options
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=30000, show_default=True)
@click.option(
    "--served-model-name", default=None, help="Model id in /v1/models [default: the target directory's name, or 'lab']."
)
@click.option(
    "--api-key",
    envvar="DDTREE_API_KEY",
    default=None,
    help="Require 'Authorization: Bearer KEY' on /v1/* [env DDTREE_API_KEY].",
)
@click.option(
    "--metrics-log-interval",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Verify steps per 'DDTREE metrics:' line on stderr.",
)
@click.option("--log-level", type=click.Choice(LOG_LEVELS), default="info", show_default=True)
@click.option(
    "--warmup-delay",
    type=click.FloatRange(min=0),
    default=0.0,
    hidden=True,
    help="Seconds to hold /health at 503 after load (tests).",
)
def serve(
    target: str,
    draft: str | None,
    algorithm: str,
    budget: int,
    topk: int,
    spine_depth: int,
    hybrid_mode: str,
    allow_hybrid_unsafe: bool,
    device: str,
    dtype: str,
    host: str,
    port: int,
    served_model_name: str | None,
    api_key: str | None,
    metrics_log_interval: int,
    log_level: str,
    warmup_delay: float,
) -> None:
    """Serve the reference engine over an OpenAI-compatible HTTP API."""
    import uvicorn

    spec = spec_from_options(algorithm, budget, topk, spine_depth, hybrid_mode, allow_hybrid_unsafe, draft)
    sock = bind_listen_socket(host, port)
    logging.basicConfig(
        level=log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    def load() -> Engine:
        # Deferred on purpose: the backend (torch, transformers) loads in the server's loading
        # thread, after the port is bound and answers /health with 503.
        from ..reference.engine import load_engine

        return load_engine(target, draft, spec, device=device, dtype=dtype)

    server: uvicorn.Server | None = None

    def stop_on_load_failure(_exc: BaseException) -> None:
        if server is not None:
            server.should_exit = True

    settings = ServerSettings(
        host=host,
        port=port,
        served_model_name=served_model_name or served_model_name_for(target),
        api_key=api_key or None,
        metrics_log_interval=metrics_log_interval,
        warmup_delay_s=warmup_delay,
        on_load_failure=stop_on_load_failure,
    )
    app = create_app(load, settings)
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=log_level == "debug"))
    server.run(sockets=[sock])
    runtime = app.state.runtime
    if runtime.load_exception is not None:
        click.echo(f"error: the engine failed to load: {runtime.load_error}", err=True)
        # A model directory that does not load is bad input (the engine's errors carry 2).
        sys.exit(getattr(runtime.load_exception, "exit_code", 1))
