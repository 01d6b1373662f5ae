"""Stop signals of the command-line tools (Ctrl-C, SIGTERM, SIGHUP): each unwinds the command, so no temporary
file is left, and is kept to be raised again where libsndfile's callbacks dropped it."""

from __future__ import annotations

import sys
from typing import Any


class PendingStop:
    """The exception of a stop signal (Ctrl-C, SIGTERM, SIGHUP), kept until the command ends. Raised while
    libsndfile decodes audio held in memory (stdin, a pipe: read through cffi callbacks), it is printed and
    dropped there ("Exception ignored from cffi callback"), the decoding just stops, and the command wrote the
    output and exited 0, as if never stopped. :meth:`check`, called
    after each block and before anything is written, raises it again."""

    raised: BaseException | None = None

    @classmethod
    def check(cls, _frames: int = 0) -> None:
        if cls.raised is not None:
            raise cls.raised


def quiet_stops(unraisable: Any) -> None:
    """A stop dropped in libsndfile's read callback is raised again (:class:`PendingStop`): its "Exception ignored
    from cffi callback" traceback is not printed. Anything else is, as Python prints it."""
    if not isinstance(unraisable.exc_value, KeyboardInterrupt | SystemExit):
        sys.__unraisablehook__(unraisable)


def interrupted(signum: int, frame: Any) -> None:
    """Ctrl-C: Python's own KeyboardInterrupt, kept for :class:`PendingStop`."""
    PendingStop.raised = KeyboardInterrupt()
    raise KeyboardInterrupt


def terminated(signum: int, frame: Any, pipe: bool = False) -> None:
    """SIGTERM, or SIGHUP (the terminal or ssh session went away): unwind, so no temporary file is left."""
    if not isinstance(PendingStop.raised, SystemExit):  # said once, however often it is raised again
        print("enhance-cli: terminated" + ("" if pipe else " (no partial output is left)"), file=sys.stderr)
    PendingStop.raised = SystemExit(128 + signum)
    raise SystemExit(128 + signum)
