"""The admission gate on its own: first come first served, a bounded queue, deadlines, and places
given up by clients that left; the in-flight gauges and load counters follow every path."""

from __future__ import annotations

import asyncio
import time

import pytest
from ddtree_engine.server.admission import Admission, ClientGone
from ddtree_engine.server.metrics import InFlight, LoadCounters
from ddtree_engine.server.requests import ApiError


def gate(max_queue: int = 2, timeout_s: float | None = None) -> Admission:
    return Admission(max_queue, timeout_s, InFlight(), LoadCounters(max_queue))


async def connected() -> bool:
    return False


def soon(awaitable):
    """Fail rather than hang when the gate keeps a request waiting that it should answer."""
    return asyncio.wait_for(awaitable, 5)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_waiters_get_the_engine_in_arrival_order_and_the_queue_is_bounded():
    async def scenario():
        a = gate(max_queue=2)
        await a.acquire(None, connected)  # the first request takes the engine at once
        order = []

        async def waiter(name):
            await a.acquire(None, connected)
            order.append(name)

        tasks = [asyncio.create_task(waiter(n)) for n in ("b", "c")]
        await settle()
        assert a.in_flight.read() == (1, 2)
        with pytest.raises(ApiError) as refused:
            await soon(a.acquire(None, connected))
        assert refused.value.status == 429 and refused.value.code == "queue_full"
        assert refused.value.headers == {"Retry-After": "1"}  # no request finished yet: no estimate
        assert "2 requests wait" in refused.value.message and "--max-queue 2" in refused.value.message
        a.release()
        await settle()
        assert order == ["b"] and a.in_flight.read() == (1, 1)
        a.release()
        await settle()
        assert order == ["b", "c"] and a.in_flight.read() == (1, 0)
        a.release()
        assert a.in_flight.read() == (0, 0)
        await soon(asyncio.gather(*tasks))
        await soon(a.acquire(None, connected))  # free again: taken at once
        assert a.in_flight.read() == (1, 0)
        assert a.counters.read() == {"rejected": 1, "timeouts": 0, "disconnects": 0}

    asyncio.run(scenario())


def test_max_queue_zero_refuses_anything_while_busy():
    async def scenario():
        a = gate(max_queue=0)
        await a.acquire(None, connected)
        with pytest.raises(ApiError, match="retry after"):
            await soon(a.acquire(None, connected))
        a.release()
        await a.acquire(None, connected)

    asyncio.run(scenario())


def test_retry_after_grows_with_the_time_requests_hold_the_engine():
    async def scenario():
        a = gate(max_queue=1)
        await a.acquire(None, connected)
        a._granted_at -= 3.9  # as if the engine had been held 3.9 s
        a.release()
        await a.acquire(None, connected)
        waiting = asyncio.create_task(a.acquire(None, connected))
        await settle()
        with pytest.raises(ApiError) as refused:
            await soon(a.acquire(None, connected))
        # 3.9 s per request, one ahead in the queue plus this one: 7.8 s, rounded up.
        assert refused.value.headers["Retry-After"] == "8"
        a.release()
        await soon(waiting)
        a.release()

    asyncio.run(scenario())


def test_a_client_that_leaves_the_queue_gives_its_place_up():
    async def scenario():
        a = gate(max_queue=3)
        await a.acquire(None, connected)
        gone = False

        async def b_connection() -> bool:
            return gone

        b = asyncio.create_task(a.acquire(None, b_connection))
        c = asyncio.create_task(a.acquire(None, connected))
        await settle()
        assert a.in_flight.read() == (1, 2)
        gone = True
        with pytest.raises(ClientGone):
            await soon(b)
        assert a.in_flight.read() == (1, 1) and a.counters.read()["disconnects"] == 1
        a.release()
        await soon(c)  # the engine went to c, not to the departed b
        assert a.in_flight.read() == (1, 0)

    asyncio.run(scenario())


def test_the_deadline_passes_in_the_queue_with_a_504():
    async def scenario():
        a = gate(max_queue=1, timeout_s=0.2)
        await a.acquire(a.deadline(), connected)
        started = time.monotonic()
        with pytest.raises(ApiError) as late:
            await soon(a.acquire(a.deadline(), connected))
        assert 0.15 < time.monotonic() - started < 2.0
        assert (late.value.status, late.value.code) == (504, "request_timeout")
        assert "0.2s request timeout (waiting in the queue)" in late.value.message
        assert a.in_flight.read() == (1, 0) and a.counters.read()["timeouts"] == 1

    asyncio.run(scenario())


def test_a_place_handed_over_as_its_waiter_gives_up_passes_to_the_next():
    async def scenario():
        a = gate(max_queue=2)
        await a.acquire(None, connected)
        b = asyncio.create_task(a.acquire(None, connected))
        c = asyncio.create_task(a.acquire(None, connected))
        await settle()
        a.release()  # hands the engine to b ...
        b.cancel()  # ... which is cancelled before it could run
        with pytest.raises(asyncio.CancelledError):
            await b
        await soon(c)  # c got it: the engine was not lost
        assert a.in_flight.read() == (1, 0)
        a.release()
        assert a.in_flight.read() == (0, 0)
        await soon(a.acquire(None, connected))  # and it is free afterwards

    asyncio.run(scenario())


@pytest.mark.parametrize(("max_queue", "timeout_s", "needle"), [(-1, None, "max_queue"), (1, 0.0, "timeout")])
def test_bad_settings_are_refused(max_queue, timeout_s, needle):
    with pytest.raises(ValueError, match=needle):
        gate(max_queue, timeout_s)
