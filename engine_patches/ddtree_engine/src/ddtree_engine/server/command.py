"""`ddtree-engine serve`: parse options, check the port, run uvicorn over the app."""

from __future__ import annotations

import errno
import logging
import socket
import sys

import click

from ..cli_options import help_epilog, lab_pair_note, spec_from_options, spec_options
from ..types import Engine
from .app import DEFAULT_MAX_QUEUE, DEFAULT_REQUEST_TIMEOUT_S, ServerSettings, create_app, served_model_name_for

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


class PortInUse(click.UsageError):
    """Exit 2: the address is taken, nothing was loaded."""


def bind_listen_socket(host: str, port: int) -> socket.socket:
    """Bind `host:port` now, so a taken port fails before the model loads and no race is left.

    Raises:
        PortInUse: the port is held by another process (message says how to find it).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio switches Nagle off only on sockets whose proto says TCP
    # (base_events._set_nodelay), and accepted sockets inherit the listener's proto. With proto 0
    # every response on a kept-alive connection after the first few waited 40 ms for the client's
    # delayed ACK between its header and body segments (and so would each streamed chunk).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # Linux passes it on to accepted sockets too
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


def listen_url(sock: socket.socket) -> str:
    """The http URL a bound socket answers on, IPv6 hosts in brackets (RFC 3986).

    Args:
        sock: the bound listening socket (its real port, not the one asked for).

    Returns:
        e.g. `http://127.0.0.1:30000` or `http://[::1]:30000`.
    """
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serving_line(url: str, model_name: str) -> str:
    """The one line `serve` writes to stderr once uvicorn listens on the socket."""
    return f"serving on {url} (model {model_name}); /health answers 503 until the model is loaded and warm"


def _listening_server(config, announce: str):
    """A uvicorn.Server that writes `announce` to stderr once it accepts connections.

    uvicorn logs "Uvicorn running on ..." only for addresses it binds itself; `serve` hands it
    a socket bound before the model loads, so without this nothing says where it listens.
    """
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if self.started:
                # Printed, not logged: operators need it at every --log-level, like the journal lines.
                print(announce, file=sys.stderr, flush=True)

    return Server(config)


@click.command(
    epilog=help_epilog(
        "ddtree-engine serve --target lab --draft lab --port 8000",
        "ddtree-engine serve --target /models/Qwen3-8B --draft /models/Qwen3-8B-DFlash-b16 "
        "--budget 15 --topk 8 --host 0.0.0.0 --port 30000 --served-model-name qwen3-8b",
        "curl -s http://127.0.0.1:8000/health",
        "curl -s http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' "
        "-d '{\"model\": \"lab\", \"prompt\": \"def add(a, b):\", \"max_tokens\": 16}'",
    ),
)
@spec_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option(
    "--port", type=click.IntRange(1, 65535), default=30000, show_default=True,
    help="TCP port; bound before the model loads, so a taken port fails at once (exit 2).",
)
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
@click.option(
    "--max-queue",
    type=click.IntRange(min=0),
    default=DEFAULT_MAX_QUEUE,
    show_default=True,
    help="Requests that may wait while one generates; more are answered 429 with Retry-After.",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(min=0),
    default=DEFAULT_REQUEST_TIMEOUT_S,
    show_default=True,
    help="Seconds a request may take from arrival (queue wait included) to its last token; past it, 504. 0: none.",
)
@click.option(
    "--log-level", type=click.Choice(LOG_LEVELS), default="info", show_default=True,
    help="Level of the server's and uvicorn's log on stderr (debug adds the access log).",
)
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
    max_queue: int,
    request_timeout: float,
    log_level: str,
    warmup_delay: float,
) -> None:
    """Serve the reference engine over an OpenAI-compatible HTTP API.

    Writes `serving on URL (model NAME)` to stderr once it listens; /health answers 503 until
    the model is loaded and warm. Requests naming another "model" than NAME (or the target
    path) get 404; requests without one are served. One request generates at a time;
    --max-queue more may wait (beyond them: 429 with Retry-After), each bounded by
    --request-timeout (504); a client that disconnects stops its generation.
    """
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

    model_name = served_model_name or served_model_name_for(target)
    note = lab_pair_note(target)
    if note:
        click.echo(note, err=True)
    settings = ServerSettings(
        host=host,
        port=port,
        served_model_name=model_name,
        api_key=api_key or None,
        metrics_log_interval=metrics_log_interval,
        warmup_delay_s=warmup_delay,
        on_load_failure=stop_on_load_failure,
        max_queue=max_queue,
        request_timeout_s=request_timeout or None,
    )
    app = create_app(load, settings)
    config = uvicorn.Config(app, log_level=log_level, access_log=log_level == "debug")
    server = _listening_server(config, serving_line(listen_url(sock), model_name))
    server.run(sockets=[sock])
    runtime = app.state.runtime
    if runtime.load_exception is not None:
        click.echo(f"error: the engine failed to load: {runtime.load_error}", err=True)
        # A model directory that does not load is bad input (the engine's errors carry 2).
        sys.exit(getattr(runtime.load_exception, "exit_code", 1))
