"""Torch's CPU thread count in threads other than the one that set it.

``torch.set_num_threads(n)`` reaches OpenMP only in the calling thread: a thread started later (a server worker,
``anyio.to_thread``, a thread pool) reports ``n`` from ``torch.get_num_threads()`` but runs OpenMP regions with the
default team size (every core). That oversubscribes the CPU when several such threads work at once, and rounds
differently from the thread that set it (measured: the same stream through the same traced step differed by
2e-7 between the main thread and a worker). Call :func:`inherit_threads` at the start of work in such a thread.
"""

from __future__ import annotations

import threading

import torch

_applied = threading.local()


def inherit_threads() -> None:
    """Apply the process' torch thread count to OpenMP in the calling thread (once per thread and count)."""
    n = torch.get_num_threads()
    if getattr(_applied, "n", None) != n:
        torch.set_num_threads(n)
        _applied.n = n
