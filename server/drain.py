"""Shutting down without losing a stream's audio.

uvicorn's graceful shutdown closes every open WebSocket at once with code 1012, so the audio a stream still held
back (the engine's 32-48 ms, and the read-ahead not yet enhanced) was lost. :class:`DrainingServer` first closes
the listening sockets, then has :class:`StreamDrain` tell each open stream to stop at the end of what it has
received: the stream enhances and sends all of it, then error ``shutting_down`` (with ``retry_after``) and close
1012. The message says how many samples per channel came back, so a client can send the rest elsewhere. Only then does uvicorn's
own shutdown run (open HTTP requests go on meanwhile), within the same ``--graceful-timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.main import STARTUP_FAILURE

from server.inbox import Inbox

log = logging.getLogger("server")

SHUTTING_DOWN = "shutting_down"
SERVICE_RESTART = 1012  # WebSocket close code: the server restarts, reconnect


class ShuttingDown(Exception):
    """A stream opened after the drain began."""


class StreamDrain:
    """The open streams' inboxes (see ``server.stream``), and whether the server is shutting down. Used on the
    event loop only."""

    def __init__(self, marker: Callable[[], object]) -> None:
        self.marker = marker  # makes what a stream finds in its inbox when told to stop
        self.closing = False
        self._inboxes: set[Inbox] = set()
        self._empty = asyncio.Event()
        self._empty.set()

    def __len__(self) -> int:
        return len(self._inboxes)

    def add(self, inbox: Inbox) -> None:
        """Register an open stream; :class:`ShuttingDown` once the drain has begun."""
        if self.closing:
            raise ShuttingDown
        self._inboxes.add(inbox)
        self._empty.clear()

    def discard(self, inbox: Inbox) -> None:
        self._inboxes.discard(inbox)
        if not self._inboxes:
            self._empty.set()

    async def drain(self, timeout: float) -> bool:
        """Queue the marker behind what each open stream has received (past its inbox's bounds: the reader may be
        waiting for room) and wait up to ``timeout`` s for the streams to end; whether they all did."""
        self.closing = True
        for inbox in self._inboxes:
            inbox.push(self.marker())
        try:
            await asyncio.wait_for(self._empty.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


class DrainingServer(uvicorn.Server):
    """uvicorn's server, whose shutdown lets the open streams finish their audio first (see the module)."""

    def __init__(self, config: uvicorn.Config, streams: StreamDrain) -> None:
        super().__init__(config)
        self.streams = streams

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # no new connections while the streams drain (uvicorn's shutdown repeats this)
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        # nor new requests on kept-alive HTTP connections (they took requests and /readyz said 200 while the
        # streams drained): idle ones close now, running ones answer with Connection: close
        ws_protocol = self.config.ws_protocol_class
        for connection in list(self.server_state.connections):
            if ws_protocol is None or not isinstance(connection, ws_protocol):
                connection.shutdown()
        graceful = self.config.timeout_graceful_shutdown
        t0 = time.monotonic()
        if len(self.streams):
            log.info(
                "letting %d open stream(s) send back the audio they hold (CTRL+C to force quit)",
                len(self.streams),
            )
        draining = asyncio.ensure_future(self.streams.drain(graceful if graceful is not None else math.inf))
        while not draining.done() and not self.force_exit:  # a second Ctrl-C stops waiting, as uvicorn's does
            await asyncio.wait({draining}, timeout=0.1)
        done = draining.done() and draining.result()
        draining.cancel()
        if not done:
            log.warning("open streams did not finish the drain; uvicorn closes them (1012)")
        if graceful is not None:  # what the drain took comes out of the graceful timeout (1 s at least: at 0
            # uvicorn logged an error even with nothing left to wait for)
            self.config.timeout_graceful_shutdown = max(1, math.ceil(graceful - (time.monotonic() - t0)))
        await super().shutdown(sockets)


def serve(app: Any, streams: StreamDrain, **options: Any) -> None:
    """``uvicorn.run(app, **options)`` (one process, no reload) with a :class:`DrainingServer`: exit status 3
    when the server did not start (the port taken), as uvicorn's."""
    server = DrainingServer(uvicorn.Config(app, **options), streams)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)
