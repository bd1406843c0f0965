"""Drain reads the server's own in-flight gauges over HTTP: it waits while a request runs, gives up
at its timeout with the count, treats a closed port as idle, and refuses a server without gauges."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ddtree_ops.sweep.drain import NoInFlightGauge, check_gauges, wait_drained


class Gauges:
    """What the little server answers on /metrics: Prometheus text with (or without) the gauges."""

    def __init__(self, running: int, queued: int, with_gauges: bool = True):
        self.running, self.queued, self.with_gauges, self.scrapes = running, queued, with_gauges, 0

    def text(self) -> str:
        self.scrapes += 1
        lines = ['sglang:generation_tokens_total{model_name="lab"} 3.0']
        if self.with_gauges:
            lines += ["# TYPE sglang:num_running_reqs gauge", f'sglang:num_running_reqs{{model_name="lab"}} {self.running}.0',
                      "# TYPE sglang:num_queue_reqs gauge", f'sglang:num_queue_reqs{{model_name="lab"}} {self.queued}.0']  # fmt: skip
        return "\n".join(lines) + "\n"


@pytest.fixture
def server():
    state = {"gauges": Gauges(0, 0)}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = state["gauges"].text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield state, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_waits_until_running_and_queued_read_zero(server):
    state, url = server
    gauges = state["gauges"] = Gauges(1, 1)

    def step(_s):  # each pause, one request leaves: queued first, then the running one
        if gauges.queued:
            gauges.queued -= 1
        else:
            gauges.running = 0

    result = wait_drained(url, timeout_s=30, interval_s=0, sleep=step)
    assert result.drained and result.in_flight == 0 and gauges.scrapes == 3


def test_times_out_with_the_count_still_in_flight(server):
    state, url = server
    state["gauges"] = Gauges(1, 2)
    ticks = iter(range(100))
    result = wait_drained(url, timeout_s=5, interval_s=0, clock=lambda: float(next(ticks)), sleep=lambda _s: None)
    assert not result.drained and result.in_flight == 3 and result.waited_s >= 5


def test_a_server_without_the_gauges_is_refused(server):
    state, url = server
    state["gauges"] = Gauges(0, 0, with_gauges=False)
    with pytest.raises(NoInFlightGauge, match="sglang:num_running_reqs"):
        wait_drained(url, timeout_s=5, interval_s=0)
    with pytest.raises(NoInFlightGauge, match="nothing was touched"):
        check_gauges(url)
    state["gauges"] = Gauges(3, 0)
    check_gauges(url)  # one scrape, no waiting: busy is fine, only a missing gauge is refused
    assert state["gauges"].scrapes == 1


def test_a_closed_port_holds_no_request():
    result = wait_drained("http://127.0.0.1:1", timeout_s=5, interval_s=0)
    assert result.drained and result.in_flight is None and "not answering" in result.note
