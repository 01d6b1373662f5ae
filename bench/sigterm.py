"""SIGTERM ends a benchmark as an exception does.

Without a handler, ``kill`` (or a batch scheduler) ended the process at once: its ``finally`` blocks never ran,
so what it had started kept running (bench_server's enhance-server, still listening; bench_wait_policy's CPU
hogs, a core each, for good; bench_offline's enhance-cli run and its temporary files). Ctrl-C in a terminal was
fine: it reaches the whole process group.
"""

from __future__ import annotations

import signal
import sys


def exit_on_sigterm() -> None:
    """From now on SIGTERM raises SystemExit(143) in the main thread: cleanups run, the exit status says so."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signal.SIGTERM))
