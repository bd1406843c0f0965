"""`ddtree-engine serve` input checks: each fails with exit 2 before a model loads or a port opens."""

import socket

import click
import pytest
from click.testing import CliRunner
from ddtree_engine.cli import cli
from ddtree_engine.server.app import served_model_name_for
from ddtree_engine.server.command import PortInUse, bind_listen_socket


@pytest.fixture()
def held_port():
    """A port something is listening on."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


def serve(*args):
    return CliRunner().invoke(cli, ["serve", *args], catch_exceptions=False)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--budget", "-1"], "--budget"),
        (["--topk", "0"], "--topk"),
        (["--spine-depth", "-2"], "--spine-depth"),
        (["--metrics-log-interval", "0"], "--metrics-log-interval"),
        (["--port", "70000"], "--port"),
        (["--hybrid-mode", "unsafe"], "allow-hybrid-unsafe"),
        (["--algorithm", "beam"], "--algorithm"),
        (["--max-queue", "-1"], "--max-queue"),
        (["--request-timeout", "-5"], "--request-timeout"),
    ],
)
def test_bad_options_exit_2(qwen3_pair, args, needle):
    target, draft = qwen3_pair
    r = serve("--target", str(target), "--draft", str(draft), *args)
    assert r.exit_code == 2, r.output
    assert needle in r.output


def test_a_missing_model_directory_exits_2(tmp_path):
    r = serve("--target", str(tmp_path / "nope"), "--draft", "lab")
    assert r.exit_code == 2
    assert "is not a directory" in r.output


def test_speculation_without_a_drafter_exits_2(qwen3_pair):
    r = serve("--target", str(qwen3_pair[0]), "--algorithm", "dflash")
    assert r.exit_code == 2
    assert "needs --draft" in r.output


def test_a_taken_port_exits_2_and_says_how_to_find_the_holder(qwen3_pair, held_port):
    target, draft = qwen3_pair
    r = serve("--target", str(target), "--draft", str(draft), "--port", str(held_port))
    assert r.exit_code == 2
    assert (
        f"port {held_port} on 127.0.0.1 is already in use: stop what holds it "
        f"(ss -ltnp 'sport = :{held_port}') or pass --port"
    ) in " ".join(r.output.split())


def test_bind_listen_socket_binds_a_free_port_and_refuses_a_taken_one(held_port):
    sock = bind_listen_socket("127.0.0.1", 0)
    try:
        assert sock.getsockname()[1] > 0
    finally:
        sock.close()
    with pytest.raises(PortInUse, match=f"port {held_port} on 127.0.0.1 is already in use"):
        bind_listen_socket("127.0.0.1", held_port)


def test_served_model_name_defaults_to_the_target_directory_name():
    assert served_model_name_for("lab") == "lab"
    assert served_model_name_for("/models/Qwen3.5-27B/") == "Qwen3.5-27B"


def test_listen_url_is_the_bound_address_with_ipv6_in_brackets():
    from ddtree_engine.server.command import listen_url

    sock = bind_listen_socket("127.0.0.1", 0)
    try:
        assert listen_url(sock) == f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()
    try:
        sock = bind_listen_socket("::1", 0)
    except (click.UsageError, OSError):
        pytest.skip("no IPv6 loopback on this machine (the IPv4 case above ran)")
    try:
        assert listen_url(sock) == f"http://[::1]:{sock.getsockname()[1]}"
    finally:
        sock.close()


def test_connections_accepted_on_the_listen_socket_have_nagle_off():
    # What uvicorn does with the socket `serve` binds: asyncio's create_server(sock=...). With Nagle on,
    # a response's body segment waited for the client's delayed ACK of its header segment: 40 ms per
    # request on a kept-alive connection (seen with tcpdump against a lab host, 2026-12-01).
    import asyncio

    async def accepted_nodelay() -> int:
        listener = bind_listen_socket("127.0.0.1", 0)
        seen: asyncio.Future = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport):
                seen.set_result(transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        async with server:
            _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
            value = await asyncio.wait_for(seen, 10)
            writer.close()
        return value

    assert asyncio.run(accepted_nodelay()) != 0
