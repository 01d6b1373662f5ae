"""Server settings: one frozen dataclass, filled from the command line (``server.main``) or by tests."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from enhance.audio_io import MAX_CHANNELS
from enhance.backends import BACKENDS

MB = 1024 * 1024

# uvicorn's WebSocket settings, for enhance-server and the tests' servers alike. Its keepalive pings go on (they
# keep proxies and NAT entries open), but an unanswered one no longer fails the connection: a stream that sends
# audio faster than the model takes it is held back on purpose (the inbox is bounded, then TCP stops the client),
# so its pongs wait unread behind its audio, and with uvicorn's 20-s pong deadline a client sending 8-MiB frames
# lost its stream with 1011 and most of its output. A peer that went away is found by the stream's idle timeout.
# Its sans-I/O protocol, with pongs bounded for a client that does not read them (server/ws_protocol.py; named
# as a string: uvicorn imports it, so that this module loads without the serve extra).
UVICORN_WS: dict[str, Any] = {
    "ws": "server.ws_protocol:BoundedPongProtocol",
    "ws_ping_interval": 20.0,
    "ws_ping_timeout": None,
}


class ClientErrorLogFilter(logging.Filter):
    """uvicorn logs a WebSocket text message that is not UTF-8 as an ERROR with a traceback (it answers 1007,
    rightly): any client could fill the log with them. Logged as one WARNING line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Invalid UTF-8 sequence received from client"):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info = record.exc_text = None
            # shown as a warning: not at all under --log-level error
            return logging.getLogger(record.name).isEnabledFor(logging.WARNING)
        return True


class WebSocketTraceFilter(logging.Filter):
    """The WebSocket library logs every frame and the handshake's header lines at DEBUG on uvicorn's error log
    ("< TEXT '{...}'", "< authorization: Bearer ..."): with --log-level debug the API key (in the start message, in
    Authorization) was written to the log, and a line per 20-ms frame of every stream. Left out."""

    def filter(self, record: logging.LogRecord) -> bool:
        template = record.msg if isinstance(record.msg, str) else ""
        return not (record.levelno == logging.DEBUG and template.startswith(("< ", "> ")))


def quiet_client_errors() -> None:
    """Install :class:`ClientErrorLogFilter` and :class:`WebSocketTraceFilter` on uvicorn's error log (once)."""
    logger = logging.getLogger("uvicorn.error")
    for kind in (ClientErrorLogFilter, WebSocketTraceFilter):
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())


# connections uvicorn takes beyond limit_concurrency, for /healthz, /readyz and /metrics: with uvicorn's limit
# alone a server full of streams answered its liveness probe 503 (a restart, every stream cut) and its scrapes
PROBE_ROOM = 16
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


@dataclass(frozen=True)
class ServerConfig:
    """What the server loads and the limits it enforces.

    Models: ``models`` are names of bundled models (``models/pretrained/<name>.safetensors``); ``checkpoints``
    are checkpoint files, each ``PATH`` (served under the name stored in the checkpoint) or ``ALIAS=PATH``.
    When neither is given the bundled ``default`` model is served. The first model loaded is the default one
    of every request that names none. Clients choose among the loaded models by name only, never by path.
    """

    models: tuple[str, ...] = ()
    checkpoints: tuple[str, ...] = ()
    device: str = "cpu"
    max_upload_bytes: int = 50 * MB
    max_duration_s: float = 600.0  # per uploaded file
    max_channels: int = 8
    # frames x channels per uploaded file (the encoded output is held in memory; 16-bit WAV: 2 bytes a sample).
    # 10 minutes of 48 kHz stereo is 57.6 million, of 16 kHz 8-channel audio 76.8 million.
    max_samples: int = 80_000_000
    max_concurrency: int = 2  # enhancements running at once; more wait in a short queue (below)
    # requests waiting for a slot, first come first served; beyond this many, or after queue_timeout_s of
    # waiting, 503 + Retry-After. Each waiting request holds its upload (up to max_upload_bytes) in memory.
    max_queue: int = 16
    queue_timeout_s: float = 10.0
    request_timeout_s: float = 120.0  # per enhancement; 504 after that
    upload_timeout_s: float = 60.0  # to receive an upload; 408 after that
    retry_after_s: int = 2
    api_key: str | None = field(default=None, repr=False)  # required on /v1/* when set (X-API-Key or Bearer)
    cors_origins: tuple[str, ...] = ()
    threads: int = 0  # torch intra-op threads; 0 leaves torch's default
    max_streams: int = 8  # WebSocket streams at once
    max_stream_s: float = 3600.0  # audio seconds per WebSocket stream
    stream_idle_timeout_s: float = 60.0  # no message and none of its audio to enhance for this long: closed
    # what runs streams' steps (enhance.backends): one per model, shared by its streams
    stream_backend: str = "auto"
    # where streams run: the CPU by default also when ``device`` is a GPU (a 16-ms hop is a few hundred small
    # kernels: on an H200 a hop took 5.6-6.5 ms against 1.3-1.5 for the C step on one core, bench/results/device-cuda.md)
    stream_device: str = "cpu"
    load_in_background: bool = True  # serve /healthz (and 503 on /readyz) while the model loads
    # HTTP requests and WebSocket streams handled at once, the probes and /metrics apart (None: no limit); beyond
    # it 503 busy (JSON) or close 1013. enhance-server gives uvicorn this plus PROBE_ROOM as its own limit
    limit_concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.max_upload_bytes <= 0:
            raise ValueError("max_upload_bytes must be positive")
        if self.max_duration_s <= 0 or self.max_stream_s <= 0:
            raise ValueError("max_duration_s and max_stream_s must be positive")
        if self.max_samples < 1:
            raise ValueError("max_samples must be positive")
        if self.max_concurrency < 1 or self.max_streams < 0 or self.max_channels < 1:
            raise ValueError("max_concurrency and max_channels must be >= 1, max_streams >= 0")
        if self.max_channels > MAX_CHANNELS:
            raise ValueError(f"max_channels: at most {MAX_CHANNELS} (the engine's limit)")
        if min(self.request_timeout_s, self.upload_timeout_s, self.stream_idle_timeout_s) <= 0:
            raise ValueError("timeouts must be positive")
        if self.max_queue < 0 or self.queue_timeout_s < 0:
            raise ValueError("max_queue and queue_timeout_s must be >= 0 (0: refuse at once when busy)")
        if self.stream_backend not in BACKENDS:
            raise ValueError(f"stream_backend must be one of {', '.join(BACKENDS)}")
        if self.threads < 0:
            raise ValueError("threads must be >= 0")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty (leave it unset to disable authentication)")

    @property
    def model_specs(self) -> tuple[str, ...]:
        """The bundled model names to load (``default`` when nothing at all is configured)."""
        if not self.models and not self.checkpoints:
            return ("default",)
        return self.models
