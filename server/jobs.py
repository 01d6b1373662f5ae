"""Running model work off the event loop: a hard bound on concurrency, a short bounded wait queue, deadlines.

* At most ``max_concurrency`` jobs hold a slot. A request that finds every slot busy waits for one, first come
  first served, but only briefly and only a few of them: beyond ``max_queue`` waiting requests, or after
  ``queue_timeout_s`` of waiting, it is refused with 503 + Retry-After. So a burst is absorbed, while load far
  beyond capacity costs nothing but a small response (and never an unbounded pile of held uploads).
* A job runs in a thread of a pool with exactly as many workers as slots. Its slot is released when the job
  really ends, so a request that gave up (timeout, client gone) never lets more jobs run than configured.
  A request that gives up while still waiting leaves the queue and takes no slot.
* On timeout the request gets 504 and the job is asked to stop: its ``cancel`` event is checked between blocks
  of audio (see :class:`Job`). The processing timeout counts from the moment the job has a slot.
* A client that closes its connection while its request waits or runs gives the request up the same way
  (:meth:`JobRunner.run_until_gone`): the servers under FastAPI do not cancel a handler when its client goes,
  so the route watches for the disconnect itself. Without that, a browser that aborted a request (the web page
  does when a new file is picked) would still hold a slot until the job ended.

The slot bookkeeping (an :class:`asyncio.Semaphore` and two counters) is touched only on the event loop: worker
threads hand the end of a job back to the loop through the job's asyncio future.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from enhance.threads import inherit_threads
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
    def __init__(
        self,
        max_concurrency: int,
        timeout_s: float,
        retry_after_s: int,
        metrics: Metrics,
        *,
        max_queue: int = 0,
        queue_timeout_s: float = 0.0,
    ) -> None:
        self.max_concurrency, self.timeout_s, self.retry_after_s = max_concurrency, timeout_s, retry_after_s
        self.max_queue, self.queue_timeout_s = max_queue, queue_timeout_s
        self.metrics = metrics
        self._slots = asyncio.Semaphore(max_concurrency)  # bound to the loop that first waits on it
        self._running = 0  # jobs holding a slot
        self._waiting = 0  # requests waiting for one
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="enhance")

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def full(self) -> bool:
        """No free slot and no room left in the queue: a request arriving now would be refused."""
        return self._slots.locked() and self._waiting >= self.max_queue

    def busy_error(self) -> ApiError:
        return ApiError(
            503,
            "busy",
            f"all {self.max_concurrency} enhancement slots are busy"
            + (f" and the wait queue is full ({self.max_queue} requests)" if self.max_queue else "")
            + "; retry later",
            {"Retry-After": str(self.retry_after_s)},
        )

    def queue_timeout_error(self) -> ApiError:
        return ApiError(
            503,
            "queue_timeout",
            f"no enhancement slot became free within {self.queue_timeout_s:g} s; retry later",
            {"Retry-After": str(self.retry_after_s)},
        )

    async def _acquire(self) -> None:
        """Take a slot, waiting for one within the queue's bounds; 503 beyond them."""
        if self._slots.locked():
            if self._waiting >= self.max_queue:
                raise self.busy_error()
            self._waiting += 1
            self.metrics.waiting.inc()
            try:  # FIFO; a waiter cancelled (timeout, client gone) just as it got the slot passes it on
                await asyncio.wait_for(self._slots.acquire(), self.queue_timeout_s)
            except asyncio.TimeoutError:
                raise self.queue_timeout_error() from None
            finally:
                self._waiting -= 1
                self.metrics.waiting.dec()
        else:
            await self._slots.acquire()  # free: returns at once
        self._running += 1
        self.metrics.enhancing.inc()

    def _release(self, _: object = None) -> None:
        self._running -= 1
        self.metrics.enhancing.dec()
        self._slots.release()

    async def run(self, fn: Callable[[Job], T]) -> T:
        """Run ``fn(job)`` in the pool once a slot is free; 503 when none is within the queue's bounds, 504
        after the timeout."""
        await self._acquire()
        job = Job()

        def work() -> T:
            inherit_threads()  # the server's --threads, also for OpenMP in this worker thread
            job.check()
            return fn(job)

        try:
            future = self._pool.submit(work)
        except RuntimeError:  # pool shut down
            self._release()
            raise ApiError(503, "shutting_down", "the server is shutting down") from None
        wrapped = asyncio.wrap_future(future)
        wrapped.add_done_callback(_retrieve)  # an abandoned job's error is not "never retrieved"
        wrapped.add_done_callback(self._release)  # on the loop, when the job really ended (or was cancelled)
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

    async def run_until_gone(self, fn: Callable[[Job], T], gone: Callable[[], Awaitable[None]]) -> T:
        """:meth:`run`, given up as soon as ``gone()`` returns (the client closed its connection): a waiting
        request leaves the queue, a running job is asked to stop, and the request ends with 499."""
        task = asyncio.ensure_future(self.run(fn))
        watcher = asyncio.ensure_future(gone())
        try:
            done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            watcher.cancel()
        if task in done:
            return task.result()
        task.cancel()
        # its own end (a 504, ...) no longer matters
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise client_gone_error()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def client_gone_error() -> ApiError:
    """499 (nginx's "client closed request"): nobody reads it, but the metrics count it apart from errors."""
    return ApiError(499, "client_closed_request", "the client closed the connection")


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
