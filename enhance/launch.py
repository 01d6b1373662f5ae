"""Console-script entry points (``enhance-cli``, ``enhance-server``) that load the heavy modules (torch, about
1.5 s) inside a Ctrl-C guard: an interrupt while Python imports them ends the command with exit status 130 and
one line on stderr, not a traceback through torch's import machinery. Once loaded, each command's own ``main``
handles interrupts as it documents."""

from __future__ import annotations

import sys
from collections.abc import Callable


def _guarded(name: str, load: Callable[[], Callable[[], int]]) -> int:
    try:
        main = load()
        return main()
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130


def _cli_main() -> Callable[[], int]:
    from enhance.cli import main

    return main


def _server_main() -> Callable[[], int]:
    from server.main import main

    return main


def cli() -> int:
    return _guarded("enhance-cli", _cli_main)


def server() -> int:
    return _guarded("enhance-server", _server_main)
