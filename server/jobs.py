"""Running model work off the event loop, with a hard bound on concurrency and a deadline.

* At most ``max_concurrency`` jobs hold a slot; one more is refused at once (503 + Retry-After) rather than
  queued, so load beyond capacity costs nothing but a small response.
* A job runs in a thread of a pool with exactly as many workers as slots. It releases its slot itself when it
  really ends, so a request that gave up (timeout, client gone) never lets more jobs run than configured.
* On timeout the request gets 504 and the job is asked to stop: its ``cancel`` event is checked between blocks
  of audio (see :class:`Job`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from server.errors import ApiError
from server.metrics import Metrics

T = TypeVar("T")


class JobCancelled(Exception):
    """Raised inside a job that was asked to stop."""


class Job:
    """Handed to the work function: ``check()`` raises :class:`JobCancelled` once the request gave up."""

    def __init__(self) -> None:
        self.cancel = threading.Event()

    def check(self) -> None:
        if self.cancel.is_set():
            raise JobCancelled("cancelled")


class JobRunner:
    def __init__(self, max_concurrency: int, timeout_s: float, retry_after_s: int, metrics: Metrics) -> None:
        self.max_concurrency, self.timeout_s, self.retry_after_s = max_concurrency, timeout_s, retry_after_s
        self.metrics = metrics
        self._lock = threading.Lock()
        self._running = 0
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="enhance")

    @property
    def running(self) -> int:
        return self._running

    def try_acquire(self) -> bool:
        with self._lock:
            if self._running >= self.max_concurrency:
                return False
            self._running += 1
        self.metrics.enhancing.inc()
        return True

    def release(self) -> None:
        with self._lock:
            self._running -= 1
        self.metrics.enhancing.dec()

    def busy_error(self) -> ApiError:
        return ApiError(
            503,
            "busy",
            f"all {self.max_concurrency} enhancement slots are busy; retry later",
            {"Retry-After": str(self.retry_after_s)},
        )

    async def run(self, fn: Callable[[Job], T]) -> T:
        """Run ``fn(job)`` in the pool; 503 when no slot is free, 504 after the timeout."""
        if not self.try_acquire():
            raise self.busy_error()
        job = Job()

        def work() -> T:
            try:
                job.check()
                return fn(job)
            finally:
                self.release()

        try:
            future = self._pool.submit(work)
        except RuntimeError:  # pool shut down
            self.release()
            raise ApiError(503, "shutting_down", "the server is shutting down") from None
        wrapped = asyncio.wrap_future(future)
        wrapped.add_done_callback(_retrieve)  # an abandoned job's error is not "never retrieved"
        try:
            return await asyncio.wait_for(asyncio.shield(wrapped), self.timeout_s)
        except asyncio.TimeoutError:
            job.cancel.set()
            raise ApiError(
                504, "timeout", f"enhancement took longer than the limit of {self.timeout_s:g} s"
            ) from None
        except asyncio.CancelledError:  # the client went away: stop the work too
            job.cancel.set()
            raise

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
