"""Admission to the engine: one request generates at a time (batch size 1), at most `max_queue`
wait for it in arrival order, each with a deadline, and a client that goes away gives up its place.

The gate lives on the event loop (every method runs there), so the queue needs no lock; the
engine runs in a worker thread per admitted request, which hands the engine back through
`loop.call_soon_threadsafe` when it returns. The slot is held until the engine is really free:
a request cut short (timeout, disconnect) stops at its next verify step, and only then does the
next one start.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable

from ..types import GenerationResult, SamplingParams, TokenCallback
from .metrics import InFlight, LoadCounters
from .requests import ApiError

POLL_S = 0.1  # how often a waiting request looks for its client's disconnect and its deadline
RETRY_AFTER_MAX_S = 60


class ClientGone(Exception):
    """The client disconnected; nobody reads the answer."""


def timeout_error(timeout_s: float, phase: str) -> ApiError:
    """The 504 of a request past `--request-timeout`; `phase` says where it was (queued or generating)."""
    return ApiError(
        504,
        f"the request did not finish within the server's {timeout_s:g}s request timeout ({phase}); "
        "retry later, ask for fewer max_tokens, or raise --request-timeout",
        code="request_timeout",
    )


class Job:
    """One admitted request running on the engine in a worker thread."""

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.cancelled = threading.Event()  # set: stop at the next verify step
        self.timed_out = False
        self.future: concurrent.futures.Future[GenerationResult] = concurrent.futures.Future()

    def stop(self, timed_out: bool = False) -> None:
        self.timed_out = self.timed_out or timed_out
        self.cancelled.set()

    def should_stop(self) -> bool:
        """Checked after each committed chunk: a cut-short request stops there."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.timed_out = True
        return self.timed_out or self.cancelled.is_set()


class Admission:
    """The engine slot, its bounded FIFO of waiters, and what they add to the metrics."""

    def __init__(self, max_queue: int, timeout_s: float | None, in_flight: InFlight, counters: LoadCounters) -> None:
        if max_queue < 0:
            raise ValueError(f"expected max_queue >= 0, got {max_queue}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"expected a request timeout > 0 (or None), got {timeout_s}")
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.in_flight = in_flight
        self.counters = counters
        self._busy = False
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._granted_at = 0.0
        self._service_s: float | None = None  # moving average of how long a request holds the engine

    def deadline(self) -> float | None:
        """The deadline of a request arriving now (None: no timeout)."""
        return None if self.timeout_s is None else time.monotonic() + self.timeout_s

    def retry_after_s(self) -> int:
        """Seconds until the queue has likely drained one place: the Retry-After of a 429."""
        if self._service_s is None:
            return 1
        return max(1, min(RETRY_AFTER_MAX_S, math.ceil(self._service_s * (len(self._waiters) + 1))))

    async def acquire(self, deadline: float | None, is_disconnected: Callable[[], Awaitable[bool]]) -> None:
        """Wait for the engine, first come first served.

        Args:
            deadline: `time.monotonic()` by which the request must have finished (None: never).
            is_disconnected: polled while waiting; True gives the place up.

        Raises:
            ApiError: 429 when `max_queue` requests already wait (with Retry-After), 504 when
                the deadline passes in the queue.
            ClientGone: the client disconnected while waiting.
        """
        if self._busy and len(self._waiters) >= self.max_queue:
            self.counters.add("rejected")
            wait = self.retry_after_s()
            raise ApiError(
                429,
                f"the server is busy: {len(self._waiters)} requests wait for the engine (--max-queue "
                f"{self.max_queue}); retry after {wait}s",
                code="queue_full",
                headers={"Retry-After": str(wait)},
            )
        self.in_flight.enqueue()
        if not self._busy:
            self._grant()
            return
        place: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(place)
        try:
            while not place.done():
                wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
                if wait <= 0:
                    self.counters.add("timeouts")
                    raise timeout_error(self.timeout_s or 0, "waiting in the queue")
                await asyncio.wait({place}, timeout=wait)
                if not place.done() and await is_disconnected():
                    self.counters.add("disconnects")
                    raise ClientGone()
        except BaseException:
            if place.done() and not place.cancelled():
                self._hand_over()  # the engine was handed to us as we gave up: pass it on
            else:
                place.cancel()
                self._waiters.remove(place)
            self.in_flight.finish(started=False)
            raise
        self._granted_at = time.monotonic()
        self.in_flight.start()

    def _grant(self) -> None:
        self._busy = True
        self._granted_at = time.monotonic()
        self.in_flight.start()

    def release(self) -> None:
        """The admitted request's engine call returned: count it done and admit the next one."""
        held = time.monotonic() - self._granted_at
        self._service_s = held if self._service_s is None else 0.8 * self._service_s + 0.2 * held
        self.in_flight.finish(started=True)
        self._hand_over()

    def _hand_over(self) -> None:
        while self._waiters:
            place = self._waiters.popleft()
            if not place.done():
                place.set_result(None)  # stays busy: the slot passes straight to this waiter
                return
        self._busy = False

    def run(
        self,
        generate: Callable[[list[int], SamplingParams, TokenCallback], GenerationResult],
        prompt_ids: list[int],
        params: SamplingParams,
        on_tokens: Callable[[list[int]], bool | None],
        deadline: float | None,
    ) -> Job:
        """Start an admitted request in a worker thread; the slot is released when it returns.

        Args:
            generate: the engine call (blocking), e.g. `ServingRuntime.generate`.
            prompt_ids, params: its arguments.
            on_tokens: the request's own chunk callback (stop strings, streaming); the job adds
                its stop conditions (deadline, cancellation) to it.
            deadline: when the job stops itself (None: never).

        Returns:
            The Job; its `future` completes with the result or the engine's exception.
        """
        job = Job(deadline)
        loop = asyncio.get_running_loop()

        def chunk(ids: list[int]) -> bool:
            wants_stop = bool(on_tokens(ids))
            return job.should_stop() or wants_stop

        def work() -> None:
            try:
                job.future.set_result(generate(prompt_ids, params, chunk))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the job
                job.future.set_exception(exc)
            finally:
                try:
                    loop.call_soon_threadsafe(self.release)
                except RuntimeError:  # the loop closed (server shutdown): nobody waits any more
                    pass

        # A daemon thread, not an executor: a shutdown does not wait for a long generation.
        threading.Thread(target=work, name="ddtree-generate", daemon=True).start()
        return job

    async def wait(self, job: Job, is_disconnected: Callable[[], Awaitable[bool]]) -> GenerationResult:
        """Await a non-streamed job, watching its client and its deadline.

        Raises:
            ApiError: 504 past the deadline (the job stops at its next verify step), or the
                engine's own error.
            ClientGone: the client disconnected (the job stops at its next verify step).
        """
        result = asyncio.wrap_future(job.future)
        while True:
            wait = POLL_S if job.deadline is None else max(0.0, min(POLL_S, job.deadline - time.monotonic()))
            await asyncio.wait({result}, timeout=wait)
            if result.done():
                break
            if await is_disconnected():
                job.stop()
                self.counters.add("disconnects")
                _discard(result)
                raise ClientGone()
            if job.deadline is not None and time.monotonic() >= job.deadline:
                job.stop(timed_out=True)
                self.counters.add("timeouts")
                _discard(result)
                raise timeout_error(self.timeout_s or 0, "generating")
        if job.timed_out:  # the engine stopped itself at the deadline
            self.counters.add("timeouts")
            raise timeout_error(self.timeout_s or 0, "generating")
        return result.result()


def _discard(result: asyncio.Future) -> None:
    # The answer of an abandoned job is not read: retrieve its exception so asyncio does not log it.
    result.add_done_callback(lambda f: f.cancelled() or f.exception())
