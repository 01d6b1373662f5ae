"""The FastAPI application: ``create_app(config)``.

The models are loaded once, at start-up (the lifespan), into ``app.state.store``; by default in a worker thread,
so that ``/healthz`` answers at once and ``/readyz`` says 503 until they are loaded. Routes live in
:mod:`server.routes` (HTTP) and :mod:`server.stream` (WebSocket); the web page is ``server/static``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
from starlette.datastructures import Headers
from starlette.responses import MalformedRangeHeader, RangeNotSatisfiable, Response
from starlette.routing import Match
from starlette.staticfiles import NotModifiedResponse, PathLike, StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from models import CheckpointError
from server.config import PROBE_PATHS, ServerConfig, quiet_client_errors
from server.drain import StreamDrain
from server.errors import ApiError, error_body, install_handlers
from server.jobs import JobRunner
from server.metrics import Metrics
from server.registry import Loader, ModelStore, load_models, public_load_error
from server.routes import answer_head, router, v1
from server.stream import TRY_LATER, error_message, shutdown_error, stream_endpoint

log = logging.getLogger("server")
STATIC_DIR = Path(__file__).resolve().parent / "static"
DESCRIPTION = """Enhance audio files (`POST /v1/enhance`), inspect the TIM competition maps (`POST /v1/analyze`),
or stream raw PCM in real time over a WebSocket. Errors are `{"error": {"code": "...", "message": "..."}}`.
When the server has an API key, `/v1/*` needs `X-API-Key: KEY` or `Authorization: Bearer KEY`.

**WebSocket `/v1/stream`** (not part of OpenAPI):
1. send JSON `{"type": "start", "sample_rate": 16000, "channels": 1, "format": "s16le"}` (every field optional,
   these are the defaults; `f32le` also; optional `model`, `api_key` (browsers cannot set headers), `resampling`:
   `high`|`low_latency`, `high_band`: `gate`|`drop`); the server answers `{"type": "ready", "model", "sample_rate",
   "channels", "format", "latency_ms", "engine_latency_ms", "resampling_ms", "engine_sample_rate"}`: `latency_ms`
   is the most audio held back in steady state, the engine's delay (`engine_latency_ms`, 48 ms) plus the
   resamplers' (`resampling_ms`, 0 at 16 kHz);
2. send binary frames of interleaved little-endian PCM of any length (a sample frame, one sample of every channel,
   may be split across messages); enhanced PCM in the same rate, channels and
   format comes back in binary frames as it becomes final. Output sample i is input sample i (no padding, no
   timestamps): the output only lags, by at most `latency_ms`;
3. optionally, `{"type": "flush"}` (push-to-talk, mute): all the audio sent so far comes back (the last 32-48 ms,
   more with resampling, are otherwise held until more audio comes), then `{"type": "flushed", "samples": N}`;
   the stream goes on, its next audio enhanced as a new segment (the model's context starts again);
4. send `{"type": "end"}` (any case): the rest comes back, then `{"type": "done", "samples": N}` (N per channel,
   equal to the samples sent) and a normal close (1000). Anything sent after `end` is not read.

Errors are `{"type": "error", "code": "...", "message": "...", "error": "..."}` (`error`: the same text, for
earlier clients) followed by close code 1003 (`expected_start`: binary before the start message; `bad_frame`: `flush`
or `end` in the middle of a sample frame, after the audio before it came back; `nan_samples`, `bad_samples`; `bad_message`: text other than `flush` or `end`), 1008 (`bad_start`,
`unauthorized`, `model_not_found`, `too_many_channels`, `stream_too_long`: the audio up to the limit comes back
first, also after `--max-stream-seconds` plus `--stream-idle-timeout` of wall-clock time; `idle_timeout`: nothing sent and nothing being enhanced for `--stream-idle-timeout` s, WebSocket pings do not
count, the audio received comes back first), 1009 (a text message over 4096 characters), 1013 (`busy`,
`model_loading`: try again after the error's `retry_after` seconds), 1012 (`shutting_down`: the server stops;
the audio it received comes back first and the message says how many samples per channel that was; reconnect,
to another instance, after `retry_after` s) or 1011 (`internal_error`).
"""
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# the response headers a cross-origin page may read (beyond the CORS-safelisted ones)
EXPOSED_HEADERS = [
    "X-Audio-Duration",
    "X-Processing-Seconds",
    "X-Model",
    "X-Sample-Rate",
    "X-Channels",
    "X-Enhance-Warning",
    "Content-Disposition",
    "Retry-After",
]


def _template(scope: Scope) -> str:
    """The route a request matched when routing left no API route in its scope: the docs, the OpenAPI schema,
    the web page's /static mount (all of them were "unmatched"); a template or mount path, never the raw path
    (clients choose it: the series stay bounded)."""
    for route in getattr(scope.get("app"), "routes", ()):
        if route.matches(scope)[0] == Match.FULL:
            return getattr(route, "path", None) or "unmatched"
    return "unmatched"


# the page and its files are checked with the server on every load (ETag / Last-Modified: a 304 when unchanged):
# without it a browser could go on running an earlier version's app.js against an upgraded server
REVALIDATE = {"Cache-Control": "no-cache"}


class StaticFile(FileResponse):
    """A file of the web page whose bad Range header is answered as every other bad input, in JSON: Starlette
    answers it from inside the response (a plain-text 400, an empty text/plain 416), where no exception handler
    sees it; raised from the range parser instead, the error reaches the handlers of :mod:`server.errors`."""

    @classmethod
    def _parse_range_header(cls, http_range: str, file_size: int) -> list[tuple[int, int]]:
        try:
            return super()._parse_range_header(http_range, file_size)
        except (
            MalformedRangeHeader
        ):  # not Starlette's reason, which for bytes=abc is "range must be requested"
            raise ApiError(
                400,
                "invalid_range",
                f"malformed Range header {http_range[:100]!r}: expected bytes=FIRST-LAST (FIRST <= LAST), "
                "bytes=FIRST- or bytes=-LENGTH, comma-separated",
            ) from None
        except RangeNotSatisfiable as exc:
            raise ApiError(
                416,
                "range_not_satisfiable",
                f"Range {http_range[:100]!r} starts beyond the end of the {exc.max_size}-byte file",
                headers={"Content-Range": f"bytes */{exc.max_size}"},
            ) from None


class RevalidatedFiles(StaticFiles):
    """The page's files: revalidated on every load (:data:`REVALIDATE`; 304 when unchanged), a bad Range
    answered in JSON (:class:`StaticFile`)."""

    def file_response(
        self, full_path: PathLike, stat_result: os.stat_result, scope: Scope, status_code: int = 200
    ) -> Response:
        response = StaticFile(full_path, status_code=status_code, stat_result=stat_result, headers=REVALIDATE)
        if self.is_not_modified(response.headers, Headers(scope=scope)):
            return NotModifiedResponse(response.headers)
        return response


class MetricsMiddleware:
    """Counts every HTTP request by route template, method and status, and times it."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        t0 = time.perf_counter()

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        self.metrics.in_flight.inc()
        # routing rewrites the scope (a mount's root_path): a route is matched on the request as sent
        pristine = dict(scope)
        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.in_flight.dec()
            route = getattr(scope.get("route"), "path", None) or _template(pristine)
            method = str(scope.get("method", ""))
            method = method if method in KNOWN_METHODS else "other"  # clients choose it: bound the series
            self.metrics.requests.inc(route=route, method=method, status=str(status))
            self.metrics.latency.observe(time.perf_counter() - t0, route=route, method=method)


class ShutdownAnswer:
    """A request still running when uvicorn's graceful shutdown runs out (``--graceful-timeout``) is cancelled:
    uvicorn then answered a plain-text 500 and logged a traceback per request. It gets 503 ``shutting_down``
    with Retry-After in JSON instead (where its answer had not begun), so a client or a load balancer retries
    elsewhere, as for any other 503."""

    def __init__(self, app: ASGIApp, retry_after_s: int) -> None:
        self.app, self.retry_after_s = app, retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if started or task is None or not task.cancelling():  # not a cancellation of this request's task
                raise
            task.uncancel()  # answered: the task ends as a request that was refused
            log.info("%s %s cut by the shutdown", scope.get("method"), scope.get("path"))
            body = error_body("shutting_down", "the server is shutting down; retry (elsewhere)")
            headers = {"Retry-After": str(self.retry_after_s)}
            await JSONResponse(body, status_code=503, headers=headers)(scope, receive, send)


class ConcurrencyLimit:
    """At most ``limit`` HTTP requests and WebSocket connections at once, the probes and /metrics apart (they
    pass whatever the load, so a busy server still answers its liveness probe and its scrapes): beyond it 503
    ``busy`` with Retry-After; a WebSocket is accepted, told ``busy`` with ``retry_after`` and closed 1013, as a
    stream beyond ``--max-streams`` is (closed before the handshake it was an HTTP 403, which a client could not
    tell from a refused origin). Counted as rejections ``too_many_connections``."""

    def __init__(self, app: ASGIApp, limit: int, retry_after_s: int, metrics: Metrics) -> None:
        self.app, self.limit, self.retry_after_s, self.metrics = app, limit, retry_after_s, metrics
        self.active = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("path") in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        if self.active >= self.limit:
            self.metrics.rejections.inc(reason="too_many_connections")
            message = f"the server is handling {self.limit} requests and streams at once; try again shortly"
            if scope["type"] == "websocket":
                await self._refuse_stream(receive, send, message)
                return
            body = error_body("busy", message)
            response = JSONResponse(body, status_code=503, headers={"Retry-After": str(self.retry_after_s)})
            await response(scope, receive, send)
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1

    async def _refuse_stream(self, receive: Receive, send: Send, message: str) -> None:
        if (await receive())["type"] != "websocket.connect":
            return  # the client went away first
        await send({"type": "websocket.accept"})
        text = json.dumps(error_message("busy", message, self.retry_after_s))
        await send({"type": "websocket.send", "text": text})
        await send({"type": "websocket.close", "code": TRY_LATER, "reason": "busy"})


class JSONCORSMiddleware(CORSMiddleware):
    """Starlette's CORS middleware, with a refused preflight answered as every other 4xx: a JSON error body
    (Starlette's is the plain text "Disallowed CORS origin, headers")."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        what = bytes(response.body).decode().removeprefix("Disallowed CORS ")
        skip = ("content-length", "content-type")  # the rest (Vary, Access-Control-*) as Starlette sent them
        headers = {k: v for k, v in response.headers.items() if k.lower() not in skip}
        body = error_body("cors_refused", f"cross-origin request refused (not allowed: {what})")
        return JSONResponse(body, status_code=400, headers=headers)


def create_app(config: ServerConfig | None = None, *, loader: Loader | None = None) -> FastAPI:
    """The app for ``config``. ``loader`` replaces :func:`server.registry.load_models` (tests use it)."""
    config = config or ServerConfig()
    load = loader or load_models
    quiet_client_errors()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store: ModelStore = app.state.store

        async def load_now() -> None:
            try:
                models = await anyio.to_thread.run_sync(load, config, abandon_on_cancel=True)
                store.set_loaded(models)
                app.state.metrics.model_ready.set(1)
                log.info("loaded model(s): %s", ", ".join(models))
            except Exception as exc:  # the full error in the log; clients see it without server paths
                log.error("loading the model failed: %s", exc, exc_info=not isinstance(exc, CheckpointError))
                store.set_failed(public_load_error(exc, config))

        task: asyncio.Task[None] | None = None
        if config.load_in_background:
            task = asyncio.create_task(load_now())
        else:
            await load_now()
            if store.status == "failed":
                raise RuntimeError(f"cannot start: {store.error}")
        try:
            yield
        finally:
            if task is not None and not task.done():
                task.cancel()
            app.state.jobs.shutdown()

    app = FastAPI(
        title="tim-enhance",
        version="1",
        summary="Causal speech enhancement with TIM competition maps",
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    metrics = Metrics()
    app.state.config = config
    app.state.metrics = metrics
    app.state.store = ModelStore()
    app.state.jobs = JobRunner(
        config.max_concurrency,
        config.request_timeout_s,
        config.retry_after_s,
        metrics,
        max_queue=config.max_queue,
        queue_timeout_s=config.queue_timeout_s,
    )
    app.state.streams_open = 0
    app.state.stream_drain = StreamDrain(shutdown_error)  # see server.drain
    install_handlers(app)
    app.include_router(router)
    app.include_router(v1)
    app.add_api_websocket_route("/v1/stream", stream_endpoint, name="stream")

    if (STATIC_DIR / "index.html").is_file():
        static = RevalidatedFiles(directory=STATIC_DIR)

        # HEAD too, as every GET (answer_head below); served as the files under /static are, so that the
        # revalidation REVALIDATE asks for is answered 304 when the page is unchanged (it was always a 200)
        @app.get("/", include_in_schema=False, response_class=Response)
        async def index(request: Request) -> Response:
            page = STATIC_DIR / "index.html"
            return static.file_response(page, await anyio.to_thread.run_sync(os.stat, page), request.scope)

        @app.get("/favicon.ico", include_in_schema=False)  # for clients that ask here, not the page's link
        async def favicon() -> FileResponse:
            return StaticFile(STATIC_DIR / "favicon.svg", media_type="image/svg+xml")

        # the page itself lives at /: its links are relative, so served from /static/ it loaded nothing
        @app.get("/static/index.html", include_in_schema=False)
        async def index_elsewhere() -> RedirectResponse:
            # relative: behind a proxy that serves the app under /prefix/, "/" was the proxy's root
            return RedirectResponse("../", status_code=308)

        app.mount("/static", static, name="static")
    else:  # an install without the package data: the API still works
        log.warning("web page not installed (%s missing); serving the API only", STATIC_DIR)
    answer_head(app.router)
    if config.limit_concurrency is not None:  # inside CORS: a cross-origin page reads its 503 as a 503
        app.add_middleware(
            ConcurrencyLimit,
            limit=config.limit_concurrency,
            retry_after_s=config.retry_after_s,
            metrics=metrics,
        )
    if config.cors_origins:
        app.add_middleware(
            JSONCORSMiddleware,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Content-Type", "Accept", "Authorization", "X-API-Key"],
            expose_headers=EXPOSED_HEADERS,
            max_age=600,
        )
    app.add_middleware(ShutdownAnswer, retry_after_s=config.retry_after_s)
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # outermost: it counts the 503s above too
    return app
