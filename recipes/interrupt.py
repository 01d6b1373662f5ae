"""Ctrl-C in a recipes command: one line saying what was kept, exit status 130, as ``tim-train`` does (the other
commands printed a KeyboardInterrupt traceback from wherever it landed: onnxruntime, ``subprocess.wait``)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TypeVar

Main = TypeVar("Main", bound=Callable[..., int])


def on_interrupt(prog: str, kept: str) -> Callable[[Main], Main]:
    """Wrap a command's ``main``: Ctrl-C prints ``{prog}: interrupted; {kept}`` on stderr and returns 130."""

    def wrap(main: Main) -> Main:
        @functools.wraps(main)
        def run(*args: object, **kwargs: object) -> int:
            try:
                return main(*args, **kwargs)
            except KeyboardInterrupt:
                print(f"{prog}: interrupted; {kept}", file=sys.stderr)
                return 130

        return run  # type: ignore[return-value]

    return wrap
