"""``WS /v1/stream``: real-time enhancement of raw PCM over a WebSocket.

Protocol (client -> server, server -> client):

1. JSON ``{"sample_rate": 16000, "channels": 1, "format": "s16le" | "f32le"}`` (optional ``model``, ``api_key``)
   -> JSON ``{"type": "ready", "latency_ms": 48.0, ...}``
2. binary frames of interleaved little-endian PCM of any length (a sample frame may be split across messages)
   -> binary frames of enhanced PCM, same rate, channels and format, as they become final
3. optionally JSON ``{"type": "flush"}`` -> the audio held back, then ``{"type": "flushed", "samples": N}``; the
   stream goes on as a new segment
4. JSON ``{"type": "end"}`` -> the remaining samples, then ``{"type": "done", "samples": N}`` (N = samples per
   channel sent back in all, equal to the number received) and a normal close (1000).

Errors: ``{"type": "error", "code": ..., "message": ...}`` then close 1003 (data the server cannot take: binary
where JSON was expected, a flush or end inside a sample frame, NaN/inf samples or float samples beyond ±1000,
unknown message) or 1008 (bad start message, API key, more channels than ``--max-channels``, unknown model,
stream over the length limit, ``idle_timeout``: no message from the client while none of its audio was being
enhanced, for ``--stream-idle-timeout``), 1013 when busy or still loading, 1012 (``shutting_down``) when the server
stops (see server.drain: the audio received comes back first). At the length limit
(``--max-stream-seconds``, and that plus the idle timeout of wall-clock time) the audio up to the limit is
enhanced, flushed and sent before the error. A client
that reads nothing for the idle timeout gets no message (it would not read it): its stream ends and its slot is
freed. Frames over 16 MiB are closed 1009 by the WebSocket layer itself, with no JSON message.

A browser's connection from another origin than the server's own page or a ``--cors-origin`` is refused at the
handshake (HTTP 403). A stream slot (``--max-streams``) is taken once the start message has passed the API-key
check, so connections that never authenticate cannot hold the slots. At a rate other than 16 kHz, soxr
resamples each way and holds back audio of its own (``ready.resampling_ms``; ``"resampling": "low_latency"`` in
the start message takes soxr's LQ filters, which hold back less). Each connection has its own
:class:`enhance.streaming.StreamingEnhancer`; model calls run in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio.to_thread
import numpy as np
from fastapi import WebSocket, WebSocketDisconnect
from pydantic import ValidationError
from starlette.types import Message

from enhance.audio_io import MODEL_RATE, sample_value_error
from enhance.pcm import decode_pcm, encode_pcm, frame_bytes
from enhance.rate_bridge import resampling_ms
from enhance.rate_stream import RateStream
from enhance.streaming import StreamingEnhancer
from enhance.threads import inherit_threads
from server.auth import key_from_headers, key_matches
from server.drain import SERVICE_RESTART, SHUTTING_DOWN, ShuttingDown
from server.errors import ApiError
from server.inbox import Inbox
from server.metrics import Metrics
from server.schemas import StreamReady, StreamStart

log = logging.getLogger("server")

UNSUPPORTED_DATA, POLICY, TOO_BIG, TRY_LATER = 1003, 1008, 1009, 1013
# the longest JSON text message read (the start message with an API key and a model name is a few hundred bytes):
# json.loads of a 16 MiB one, sent before the key was checked, held the event loop and grew the process (a review
# measured 1-2 s stalls of /healthz and several GB with six such clients; not rerun here)
MAX_TEXT_CHARS = 4096
START_TIMEOUT_S = 10.0  # for the first message (no stream slot is held while it waits)
INBOX_MESSAGES = 64  # messages read ahead of the model
INBOX_BYTES = 4 * 1024 * 1024  # and the bytes they may hold (one larger frame still passes): see server.inbox
MAX_BATCH_S = 1.0  # most audio enhanced in one model call when frames queued up


def _in_worker(fn: Callable[..., np.ndarray], *args: Any) -> np.ndarray:
    """Run a stream's step in an anyio worker thread with the server's torch thread count (see enhance.threads)."""
    inherit_threads()
    return fn(*args)


class StreamError(Exception):
    def __init__(self, code: str, message: str, close_code: int) -> None:
        super().__init__(message)
        self.code, self.message, self.close_code = code, message, close_code


def shutdown_error() -> StreamError:
    """What an open stream finds in its inbox when the server shuts down (server.drain), behind the audio it
    received; and what a stream that starts during the drain gets."""
    return StreamError(
        SHUTTING_DOWN, "the server is shutting down; reconnect (elsewhere) and go on", SERVICE_RESTART
    )


# errors after which the audio the stream holds goes back first
_FINISH_FIRST = ("idle_timeout", "stream_too_long", SHUTTING_DOWN)

SOXR_QUALITY = {"high": "HQ", "low_latency": "LQ"}


class Session(RateStream):
    """One stream's engine, resamplers and counters, as its start message set them (used from one task; model
    calls in a thread)."""

    def __init__(self, engine: StreamingEnhancer, start: StreamStart) -> None:
        self.start = start
        super().__init__(
            engine,
            start.sample_rate,
            high_band=start.high_band == "gate",
            quality=SOXR_QUALITY[start.resampling],
        )


async def _receive(ws: WebSocket, timeout: float) -> Message:
    try:  # wait_for may lose a cancellation that races the message: _stop_reader cancels until the task ends
        return await asyncio.wait_for(ws.receive(), timeout)
    except asyncio.TimeoutError:
        raise StreamError("idle_timeout", f"no message for {timeout:g} s", POLICY) from None


class Work:
    """When a stream's model calls ran: the idle timeout counts only time in which neither the client sent
    anything nor the server worked on its audio (a client that sent minutes of audio at once and waits for the
    result is not idle)."""

    def __init__(self) -> None:
        self.running = 0
        self.last_done = time.monotonic()

    @contextlib.contextmanager
    def running_call(self) -> Iterator[None]:
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self.last_done = time.monotonic()

    def idle_s(self) -> float:
        """Seconds since the server last worked on this stream (0 while it does)."""
        return 0.0 if self.running else time.monotonic() - self.last_done


async def _receive_or_idle(
    ws: WebSocket, timeout: float, work: Work, opened: float = 0.0, open_s: float = math.inf
) -> Message:
    """The client's next message; ``idle_timeout`` once neither side did anything for ``timeout`` s, and
    ``stream_too_long`` once ``open_s`` s have passed since ``opened`` (monotonic time)."""
    waited_from, deadline = time.monotonic(), opened + open_s
    while True:
        now = time.monotonic()
        if now >= deadline:
            raise StreamError(
                "stream_too_long",
                f"stream open for {open_s:g} s (a stream may stay open for --max-stream-seconds plus "
                "--stream-idle-timeout, whatever audio it sent)",
                POLICY,
            )
        left = min(timeout - min(now - waited_from, work.idle_s()), deadline - now)
        try:
            return await _receive(ws, max(left, 0.001))
        except StreamError as err:
            if min(time.monotonic() - waited_from, work.idle_s()) >= timeout:  # the limit, not the last slice
                raise StreamError(err.code, f"no message for {timeout:g} s", err.close_code) from None


def _json_text(text: str, code: str, what: str, invalid_close: int) -> Any:
    """A text message's JSON, refused (``code``) before parsing when longer than :data:`MAX_TEXT_CHARS` (close
    1009), or when not JSON (``invalid_close``; RecursionError: "[[[[..." nested beyond Python's stack)."""
    if len(text) > MAX_TEXT_CHARS:
        raise StreamError(code, f"{what} is longer than {MAX_TEXT_CHARS} characters", TOO_BIG)
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise StreamError(code, f"{what} is not valid JSON", invalid_close) from None


def _parse_start(msg: Message) -> StreamStart:
    text = msg.get("text")
    if text is None:
        raise StreamError(
            "expected_start",
            "the first message must be JSON text: {sample_rate, channels, format}",
            UNSUPPORTED_DATA,
        )
    data = _json_text(text, "bad_start", "the first message", POLICY)
    if not isinstance(data, dict):
        raise StreamError("bad_start", "the first message must be a JSON object", POLICY)
    try:
        return StreamStart.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "message"
        raise StreamError("bad_start", f"{where}: {first.get('msg', 'invalid')}", POLICY) from None


SLOW_CLIENT = "slow_client"
SEND_ERROR_TIMEOUT_S = 5.0  # a client that reads nothing must not keep the handler waiting to tell it so


def error_message(code: str, message: str, retry_after: int | None = None) -> dict[str, Any]:
    """A stream's error message: "message" as in the HTTP errors' {"error": {"code", "message"}}, "error" (the
    same text) for earlier clients, and when to try again for busy or loading, as HTTP's Retry-After says it."""
    out: dict[str, Any] = {"type": "error", "code": code, "message": message, "error": message}
    return out | ({"retry_after": retry_after} if retry_after is not None else {})


async def _send_error(ws: WebSocket, err: StreamError, metrics: Metrics) -> None:
    metrics.rejections.inc(reason=err.code)
    if err.code == SLOW_CLIENT:
        return  # its send buffer is full: nothing more gets through, not even a close frame
    with contextlib.suppress(Exception):
        await asyncio.wait_for(
            ws.send_json(
                error_message(
                    err.code,
                    err.message,
                    ws.app.state.config.retry_after_s
                    if err.close_code in (TRY_LATER, SERVICE_RESTART)
                    else None,
                )
            ),
            SEND_ERROR_TIMEOUT_S,
        )
        await asyncio.wait_for(
            ws.close(err.close_code, reason=err.message.encode()[:120].decode(errors="ignore")),
            SEND_ERROR_TIMEOUT_S,
        )


async def _send(ws: WebSocket, data: bytes, timeout: float) -> None:
    """Send enhanced audio; a client that has read nothing for ``timeout`` s loses its stream (its slot held
    otherwise: the reader waits on the full inbox, not on a receive, so the idle timeout never starts)."""
    try:
        await asyncio.wait_for(ws.send_bytes(data), timeout)
    except asyncio.TimeoutError:
        raise StreamError(SLOW_CLIENT, f"the client read nothing for {timeout:g} s", POLICY) from None


def origin_allowed(headers: Any, allowed: tuple[str, ...]) -> bool:
    """Whether a WebSocket's Origin may use the stream. Browsers send the page's origin, and CORS does not cover
    WebSockets: without this check any web site could stream through the server from its visitors' browsers.
    Allowed: no Origin (not a browser), the server's own page (same host and port), or a --cors-origin ("*": any)."""
    origin = headers.get("origin")
    if origin is None or "*" in allowed or origin in allowed:
        return True
    host = headers.get("host", "")
    return origin in (f"http://{host}", f"https://{host}")


async def stream_endpoint(ws: WebSocket) -> None:
    state = ws.app.state
    cfg, metrics = state.config, state.metrics
    if not origin_allowed(ws.headers, cfg.cors_origins):
        metrics.rejections.inc(reason="origin")
        await ws.close(POLICY)  # before the handshake: the browser gets HTTP 403
        return
    await ws.accept()
    slot = False
    outcome = "error"
    try:
        msg = await _receive(ws, min(cfg.stream_idle_timeout_s, START_TIMEOUT_S))  # before auth: be brief
        if msg["type"] == "websocket.disconnect":
            outcome = "disconnected"
            return
        start = _parse_start(msg)
        if not key_matches(start.api_key or key_from_headers(ws.headers), cfg.api_key):
            raise StreamError("unauthorized", "missing or wrong API key", POLICY)
        if start.channels > cfg.max_channels:  # as the POST's --max-channels
            raise StreamError(
                "too_many_channels", f"{start.channels} channels; the limit is {cfg.max_channels}", POLICY
            )
        if cfg.max_streams == 0:  # for good: "busy" told clients to try again in 2 s, forever
            raise StreamError("streams_disabled", "this server takes no streams (--max-streams 0)", POLICY)
        if state.streams_open >= cfg.max_streams:
            raise StreamError("busy", f"all {cfg.max_streams} streams are in use", TRY_LATER)
        state.streams_open += 1
        metrics.streams.inc()
        slot = True
        outcome = await _serve(ws, start)
    except StreamError as err:
        await _send_error(ws, err, metrics)
    except WebSocketDisconnect:
        outcome = "disconnected"
    except Exception:
        log.exception("stream failed")
        await _send_error(ws, StreamError("internal_error", "internal server error", 1011), metrics)
    finally:
        if slot:
            state.streams_open -= 1
            metrics.streams.dec()
        metrics.streams_total.inc(outcome=outcome)


async def _serve(ws: WebSocket, start: StreamStart) -> str:
    state = ws.app.state
    cfg = state.config
    try:
        lm = state.store.get(start.model, cfg.retry_after_s)
    except ApiError as exc:
        raise StreamError(exc.code, exc.message, TRY_LATER if exc.status == 503 else POLICY) from None
    engine = StreamingEnhancer(lm.streaming_model, start.channels, backend=lm.stream_backend)
    session = Session(engine, start)
    limit = int(cfg.max_stream_s * start.sample_rate)
    # a dry run of the resamplers (about 0.5 s) the first time a rate is seen (cached): not on the event loop
    resampling = await anyio.to_thread.run_sync(
        resampling_ms,
        start.sample_rate,
        SOXR_QUALITY[start.resampling],
        engine.latency_samples,
        engine.cfg.hop_length,
    )
    ready = StreamReady(
        model=lm.name,
        sample_rate=start.sample_rate,
        channels=start.channels,
        format=start.format,
        latency_ms=session.engine.latency_ms + resampling,
        engine_latency_ms=session.engine.latency_ms,
        resampling_ms=resampling,
        engine_sample_rate=MODEL_RATE,
    )
    await ws.send_json(ready.model_dump())
    inbox: Inbox[Message | StreamError] = Inbox(INBOX_MESSAGES, INBOX_BYTES)
    work = Work()
    # open at most the audio limit plus the idle timeout: a real-time client's audio ends the stream first
    open_s = cfg.max_stream_s + cfg.stream_idle_timeout_s
    try:
        state.stream_drain.add(inbox)
    except ShuttingDown:
        raise shutdown_error() from None
    reader = asyncio.create_task(_read_into(ws, inbox, cfg.stream_idle_timeout_s, work, open_s))
    try:
        return await _process(ws, inbox, session, work, limit, cfg.stream_idle_timeout_s)
    finally:
        await _stop_reader(reader, inbox)
        state.stream_drain.discard(inbox)


async def _stop_reader(reader: asyncio.Task[None], inbox: Inbox[Message | StreamError]) -> None:
    """End the reader task whatever it is waiting on. Once the processing stopped (an error), the reader may be
    blocked putting into the full inbox, where nothing takes from it any more, or it may have lost the
    cancellation to a message that arrived at the same moment: so empty the inbox and cancel again until it has
    ended. (A single cancel-and-await hung a stream, and with it the server's shutdown, for good.)"""
    while not reader.done():
        while not inbox.empty():
            inbox.get_nowait()
        reader.cancel()
        await asyncio.wait({reader}, timeout=0.05)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        reader.result()


async def _read_into(
    ws: WebSocket, inbox: Inbox[Message | StreamError], idle_s: float, work: Work, open_s: float
) -> None:
    """Receive messages into ``inbox`` (bounded: a client far ahead of the model is throttled by TCP) for at most
    ``open_s`` seconds of wall-clock time: the audio limit alone let a client that sends a few bytes now and then
    (within the idle timeout) hold a stream slot for good, and with them every slot."""
    opened = time.monotonic()
    while True:
        try:
            msg = await _receive_or_idle(ws, idle_s, work, opened, open_s)
        except StreamError as err:
            await inbox.put(err)
            return
        await inbox.put(msg)
        if msg["type"] == "websocket.disconnect" or (msg.get("bytes") is None and _kind(msg) != "flush"):
            return  # a disconnect, or text: "end" (or an error), after which nothing more is read


def _type_of(message: Any) -> str | None:
    """A parsed text message's ``type``, lower case, as the start message's names (None: no string type)."""
    kind = message.get("type") if isinstance(message, dict) else None
    return kind.lower() if isinstance(kind, str) else None


def _kind(msg: Message) -> str | None:
    """A received text message's ``type`` (None: not JSON text with a string type; refused later, with why)."""
    try:
        return _type_of(_json_text(msg.get("text") or "", "bad_message", "a text message", UNSUPPORTED_DATA))
    except StreamError:
        return None


def _whole_frames(carry: bytes, data: bytes, width: int) -> tuple[bytes, bytes]:
    """``carry + data`` split into its whole sample frames and the bytes of an incomplete last one, which wait for
    the next message: binary messages may be of any length (a client relaying a pipe or socket cuts its reads
    anywhere), and 2-byte messages of stereo s16le ended the stream with ``bad_frame``."""
    if carry:
        data = carry + data
    cut = len(data) - len(data) % width
    return data[:cut], data[cut:]


def _decode(data: bytes, start: StreamStart) -> np.ndarray:
    """Whole sample frames (:func:`_whole_frames`) -> float32 ``[channels, n]``, refused with why when not audio."""
    x = decode_pcm(data, start.channels, start.format)
    if start.format == "s16le":  # always finite and within ±1
        return x
    problem = sample_value_error(x)  # one pass when the frame is fine
    if problem:
        code = "bad_samples" if np.isfinite(x).all() else "nan_samples"
        raise StreamError(code, f"frame: {problem}", UNSUPPORTED_DATA)
    return x


async def _enhance_piece(
    ws: WebSocket, session: Session, work: Work, x: np.ndarray, limit: int, idle_s: float
) -> None:
    """Enhance ``x`` and send what became final; at the stream's length limit, the audio up to the limit is
    enhanced and sent in full (flushed), then the error."""
    state = ws.app.state
    start, metrics = session.start, state.metrics
    n, room = x.shape[1], limit - session.received
    last = n > room
    if last:
        x = x[:, :room]
    with work.running_call():
        y = await anyio.to_thread.run_sync(_in_worker, session.process_last if last else session.process, x)
    metrics.audio_seconds.inc(x.shape[1] / start.sample_rate, route="/v1/stream")
    if y.shape[1]:
        await _send(ws, encode_pcm(y, start.format), idle_s)
    if last:
        raise StreamError(
            "stream_too_long",
            f"stream longer than {state.config.max_stream_s:g} s; the first "
            f"{session.sent} samples per channel were enhanced and sent",
            POLICY,
        )


async def _finish(ws: WebSocket, session: Session, work: Work, idle_s: float) -> None:
    """Enhance and send what the stream still holds (the engine's window and lookahead, the resamplers'), up to
    the input's length."""
    with work.running_call():
        y = await anyio.to_thread.run_sync(_in_worker, session.finish)
    if y.shape[1]:
        await _send(ws, encode_pcm(y, session.start.format), idle_s)


async def _process(
    ws: WebSocket,
    inbox: Inbox[Message | StreamError],
    session: Session,
    work: Work,
    limit: int,
    idle_s: float,
) -> str:
    """Enhance the audio messages in order. Frames that queued up while the model ran are enhanced in one call
    (the engine gives the same samples for any split), so a stream that fell behind catches up. A frame of
    bad samples among them ends the stream after the good frames before it were enhanced and sent, as if sent one by one."""
    start = session.start
    max_batch = int(MAX_BATCH_S * start.sample_rate)
    width, carry = (
        frame_bytes(start.channels, start.format),
        b"",
    )  # carry: an incomplete sample frame, completed by the next message
    held: Message | StreamError | None = None
    while True:
        msg = held if held is not None else await inbox.get()
        held = None
        if isinstance(msg, StreamError):
            if (
                msg.code in _FINISH_FIRST and session.received
            ):  # the audio it holds goes back first (it was lost)
                await _finish(ws, session, work, idle_s)
                msg = StreamError(
                    msg.code,
                    f"{msg.message}; the {session.sent} samples per channel received were enhanced and sent",
                    msg.close_code,
                )
            raise msg
        if msg["type"] == "websocket.disconnect":
            return "disconnected"
        if msg.get("bytes") is not None:
            whole, carry = _whole_frames(carry, msg["bytes"], width)
            pieces = [_decode(whole, start)]
            n = pieces[0].shape[1]
            while n < max_batch and not inbox.empty():
                nxt = inbox.get_nowait()
                if isinstance(nxt, StreamError) or nxt.get("bytes") is None:
                    held = nxt
                    break
                whole, carry = _whole_frames(carry, nxt["bytes"], width)
                try:
                    pieces.append(_decode(whole, start))
                except StreamError as err:
                    held = err
                    break
                n += pieces[-1].shape[1]
            x = pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=1)
            # a large frame (up to 16 MiB: minutes of audio) in pieces of at most max_batch: the model's memory
            # stays that of one piece, and the samples are the same for any split
            for i in range(0, n, max_batch):
                await _enhance_piece(ws, session, work, x[:, i : i + max_batch], limit, idle_s)
            continue
        kind = _type_of(_json_text(msg.get("text") or "", "bad_message", "a text message", UNSUPPORTED_DATA))
        if kind not in ("end", "flush"):
            raise StreamError(
                "bad_message",
                'unknown message; send binary PCM, {"type": "flush"} or {"type": "end"}',
                UNSUPPORTED_DATA,
            )
        await _finish(ws, session, work, idle_s)
        if carry:  # the audio came back; the bytes of a sample frame the client never completed did not
            raise StreamError(
                "bad_frame",
                f"the stream {'was flushed' if kind == 'flush' else 'ended'} {len(carry)} bytes into a "
                f"{width}-byte sample frame ({start.channels}-channel {start.format}); the {session.sent} "
                "whole samples per channel before it were enhanced and sent",
                UNSUPPORTED_DATA,
            )
        if kind == "flush":  # push-to-talk, mute: the held audio back now, and the stream goes on
            session.restart()
            await ws.send_json({"type": "flushed", "samples": session.sent})
            continue
        await ws.send_json({"type": "done", "samples": session.sent})
        await ws.close(1000)
        return "done"
