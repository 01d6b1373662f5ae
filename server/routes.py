"""HTTP routes. Thin: read and check the request, run the work in the job pool, shape the response."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request
from fastapi.dependencies.models import Dependant
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from enhance.audio_io import AudioInfo
from server.audio import (
    OUTPUT_FORMATS,
    download_disposition,
    multipart_form,
    negotiate_analyze_format,
    negotiate_audio_format,
    safe_name,
    safe_stem,
    warning_header,
)
from server.auth import require_api_key
from server.errors import ApiError
from server.jobs import Job
from server.json_text import json_bytes
from server.metrics import CONTENT_TYPE
from server.registry import LoadedModel
from server.schemas import (
    MODEL_NAME_MAX,
    AnalyzeFormat,
    AnalyzeResponse,
    AudioFormat,
    ErrorResponse,
    HealthResponse,
    HighBand,
    ModelInfo,
    ModelsResponse,
    ReadyResponse,
)
from server.upload import UPLOAD_FIELD, Upload, client_gone, read_upload
from server.work import Limits, analyze_png, analyze_upload, check_output, enhance_upload, inspect_upload

_BINARY = {"type": "string", "format": "binary"}
AUDIO_REQUEST_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": (
            "The audio file: any format libsndfile reads (WAV, FLAC, OGG/Vorbis, AIFF, ...), any sample rate, "
            f"mono or multi-channel. Either multipart/form-data with the field '{UPLOAD_FIELD}', or the file "
            "itself as the body (Content-Type audio/* or application/octet-stream)."
        ),
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": [UPLOAD_FIELD],
                    "properties": {UPLOAD_FIELD: _BINARY},
                },
                "encoding": {UPLOAD_FIELD: {"contentType": "audio/*, application/octet-stream"}},
            },
            "application/octet-stream": {"schema": _BINARY},
            "audio/wav": {"schema": _BINARY},
            "audio/flac": {"schema": _BINARY},
            "audio/ogg": {"schema": _BINARY},
        },
    }
}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    texts = {
        400: "`empty_body`, or `bad_multipart`: malformed multipart",
        408: "the upload took longer than the upload timeout",
        401: "API key missing or wrong (only when the server has one)",
        404: "`model_not_found`: no loaded model of that name",
        406: "cannot produce the requested output format",
        413: "upload, audio duration or samples (duration x channels x rate) over the limit",
        415: "`unsupported_media_type`: Content-Type is not multipart/form-data, audio/* or application/octet-stream",
        422: "audio that cannot be enhanced: `unsupported_format` (not a container/codec the server reads: "
        "convert it, e.g. to WAV), `invalid_audio` (corrupt, zero-length, NaN/inf samples), "
        "`unsupported_output` (the output format cannot hold the input's rate: Ogg Vorbis above 200 kHz, FLAC above 655,350 Hz), "
        "`unknown_parameter` (a query parameter the route does not take: a misspelt name was ignored), "
        "`repeated_parameter` (one given twice), `missing_file` (no file part), or bad parameter values "
        "(`invalid_request`)",
        503: "`model_loading`, or `busy`: all enhancement slots busy and the wait queue full or too slow; retry "
        "after the Retry-After header's seconds",
        504: "processing took longer than the request timeout",
    }
    out: dict[int | str, dict[str, Any]] = {
        c: {"model": ErrorResponse, "description": texts[c]} for c in codes
    }
    if 503 in out:  # generated clients read it from here (it was only named in the text)
        out[503]["headers"] = {
            "Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}
        }
    return out


AUDIO_ERRORS = _errors(400, 401, 404, 408, 413, 415, 422, 503, 504)


def _model_query() -> Any:
    return Query(
        max_length=MODEL_NAME_MAX, description="name of a loaded model (GET /v1/models); default: the first"
    )


def _query_names(dependant: Dependant) -> list[str]:
    """The query parameters a route takes: its own and its dependencies', in declaration order."""
    names = [field.alias for field in dependant.query_params]
    for sub in dependant.dependencies:
        names += [n for n in _query_names(sub) if n not in names]
    return names


def _quoted(names: list[str]) -> str:
    """Client-chosen names for a message: each cut to 40 characters, at most 5 of them (the message stays short)."""
    shown = ", ".join(repr(n[:40]) for n in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


async def known_query(request: Request) -> None:
    """Refuses a query parameter the route does not take, or one given twice: FastAPI ignores both, so
    ``?fromat=flac`` was a 200 WAV and ``?format=flac&format=wav`` silently took the last. A dependency of each
    route with query parameters; the accepted names come from the route itself, so they cannot drift."""
    route = request.scope.get("route")
    accepted = _query_names(route.dependant) if isinstance(route, APIRoute) else []
    given = collections.Counter(name for name, _ in request.query_params.multi_items())
    unknown = [n for n in given if n not in accepted]
    if unknown:
        raise ApiError(
            422,
            "unknown_parameter",
            f"unknown query parameter{'s' if len(unknown) > 1 else ''} {_quoted(unknown)}; "
            f"{request.url.path} takes: {', '.join(accepted) or 'none'}",
        )
    repeated = [n for n, count in given.items() if count > 1]
    if repeated:
        raise ApiError(
            422,
            "repeated_parameter",
            f"query parameter {_quoted(repeated)} given more than once: give it once",
        )


KNOWN_QUERY = [Depends(known_query)]
router = APIRouter()
v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])


def _limits(request: Request) -> Limits:
    cfg = request.app.state.config
    return Limits(cfg.max_duration_s, cfg.max_channels, cfg.max_samples)


def _precheck(request: Request, model: str | None) -> LoadedModel:
    """Cheap refusals before the body is read: unknown model, loading, no free slot and the queue full."""
    state = request.app.state
    lm: LoadedModel = state.store.get(model, state.config.retry_after_s)
    if state.jobs.full:
        raise state.jobs.busy_error()
    return lm


async def _receive(request: Request, model: str | None) -> tuple[LoadedModel, Upload, str, Limits, AudioInfo]:
    """What both audio routes do first: refuse early, read the body within the limits, check the audio header."""
    lm = _precheck(request, model)
    cfg = request.app.state.config
    upload = await read_upload(request, cfg.max_upload_bytes, cfg.upload_timeout_s)
    name = safe_name(upload.filename)  # for messages; downloads are named by safe_stem
    limits = _limits(request)
    return lm, upload, name, limits, inspect_upload(upload.data, name, limits)


T = TypeVar("T")


class Timed:
    """Wraps a job to time it in its worker: X-Processing-Seconds is the work, not the wait for a free slot
    (the page's "enhanced in X s" counted the queue too)."""

    seconds = 0.0

    def __call__(self, fn: Callable[[Job], T]) -> Callable[[Job], T]:
        def run(job: Job) -> T:
            t0 = time.perf_counter()
            try:
                return fn(job)
            finally:
                self.seconds = time.perf_counter() - t0

        return run


@v1.post(
    "/enhance",
    summary="Enhance an audio file",
    description=(
        "Returns the enhanced audio at the input's sample rate, channel count and length. Output format: "
        "`?format=` or the Accept header (audio/wav, audio/flac, audio/ogg); WAV by default."
    ),
    response_class=Response,
    responses={
        200: {
            "description": "the enhanced audio",
            "content": {OUTPUT_FORMATS[f][1]: {"schema": _BINARY} for f in OUTPUT_FORMATS},
            "headers": {
                "X-Audio-Duration": {"description": "input duration (s)", "schema": {"type": "number"}},
                "X-Processing-Seconds": {
                    "description": "time spent enhancing (s), not counting the wait for a free slot",
                    "schema": {"type": "number"},
                },
                "X-Model": {"description": "model used", "schema": {"type": "string"}},
                "X-Sample-Rate": {"description": "sample rate (Hz)", "schema": {"type": "integer"}},
                "X-Channels": {"description": "channel count", "schema": {"type": "integer"}},
                "X-Enhance-Warning": {
                    "description": "only when the audio was enhanced with a caveat: a file whose audio ends before "
                    "the length its header gives (a cut upload) is enhanced as far as it decodes, and this says so; "
                    "digital silence (all samples zero) is enhanced, and this says so",
                    "schema": {"type": "string"},
                },
            },
        },
        **AUDIO_ERRORS,
        **_errors(406),
    },
    openapi_extra=AUDIO_REQUEST_BODY,
    dependencies=KNOWN_QUERY,
)
async def enhance(
    request: Request,
    format: Annotated[
        AudioFormat | None, Query(description="output format; overrides the Accept header")
    ] = None,
    model: Annotated[str | None, _model_query()] = None,
    high_band: Annotated[
        HighBand,
        Query(
            description="inputs above 16 kHz: keep the band above 8 kHz, gated by the model's 6-8 kHz gain "
            "(gate), or leave it out (drop: the 16 kHz model's band only)"
        ),
    ] = HighBand.gate,
) -> Response:
    fmt = negotiate_audio_format(format.value if format else None, request.headers.get("accept"))
    lm, upload, name, limits, info = await _receive(request, model)
    check_output(info, name, fmt)
    state = request.app.state
    timed = Timed()
    encoded, result = await state.jobs.run_until_gone(
        timed(
            lambda job: enhance_upload(
                lm, upload.data, info, name, fmt, limits, job, high_band=high_band == HighBand.gate
            )
        ),
        lambda: client_gone(request),
    )
    state.metrics.audio_seconds.inc(result.duration_s, route="/v1/enhance")
    ext, stem = OUTPUT_FORMATS[fmt][2], safe_stem(upload.filename, "upload")
    headers = {
        "X-Audio-Duration": f"{result.duration_s:.4f}",
        "X-Processing-Seconds": f"{timed.seconds:.4f}",
        "X-Model": lm.name,
        "X-Sample-Rate": str(result.sample_rate),
        "X-Channels": str(result.channels),
        "Content-Disposition": download_disposition(upload.filename, stem, f".enhanced.{ext}"),
    }
    if result.warnings:  # the CLI prints them; a client gets them here
        headers["X-Enhance-Warning"] = warning_header(result.warnings)
    return Response(encoded, media_type=OUTPUT_FORMATS[fmt][1], headers=headers)


@v1.post(
    "/analyze",
    summary="Competition maps and levels of an audio file",
    description=(
        "Enhances the file and returns, per TIM block, the competition scores of each frame (of channel 0), "
        "their mean entropy, and the input/output RMS levels. `?format=png` (or Accept: image/png) returns the "
        "maps drawn under the input's spectrogram instead; 406 for an Accept header that allows neither. "
        "`?audio=wav|flac|ogg` returns the enhanced audio with the analysis, from the same single run: a "
        "`multipart/form-data` body with the parts `analysis` (the JSON) and `audio` (the file /v1/enhance "
        "gives; read it with `Response.formData()` in a browser, or any multipart parser)."
    ),
    response_model=AnalyzeResponse,
    responses={
        200: {
            "content": {
                "image/png": {"schema": _BINARY},
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "properties": {
                            "analysis": {"$ref": "#/components/schemas/AnalyzeResponse"},
                            "audio": _BINARY,
                        },
                    }
                },
            },
            "description": "the analysis (JSON), the figure (PNG), or the analysis and the audio (multipart)",
        },
        **AUDIO_ERRORS,
        **_errors(406),
    },
    openapi_extra=AUDIO_REQUEST_BODY,
    dependencies=KNOWN_QUERY,
)
async def analyze(
    request: Request,
    format: Annotated[
        AnalyzeFormat | None, Query(description="json (default) or png; overrides the Accept header")
    ] = None,
    model: Annotated[str | None, _model_query()] = None,
    audio: Annotated[
        AudioFormat | None,
        Query(description="also return the enhanced audio, in this format (the response is then multipart)"),
    ] = None,
) -> Response:
    if audio is not None:  # the query picks the answer, multipart, as ?format= wins over Accept (Accept:
        # multipart/form-data, the right header for it, was a 406)
        if format is not None and format.value == "png":
            raise ApiError(
                422,
                "invalid_request",
                "audio= comes with the JSON analysis, not with format=png (ask for one or the other)",
            )
        png = False
    else:
        png = (
            negotiate_analyze_format(format.value if format else None, request.headers.get("accept")) == "png"
        )
    lm, upload, name, limits, info = await _receive(request, model)
    if audio is not None:
        check_output(info, name, audio.value)
    state = request.app.state
    timed = Timed()
    headers = {"X-Model": lm.name}
    if png:
        image, seconds = await state.jobs.run_until_gone(
            timed(lambda job: analyze_png(lm, upload.data, info, name, limits, job)),
            lambda: client_gone(request),
        )
        # the audio that decoded, as /v1/enhance says it (a truncated file's header gives more)
        state.metrics.audio_seconds.inc(seconds, route="/v1/analyze")
        headers["X-Audio-Duration"] = f"{seconds:.4f}"
        headers["X-Processing-Seconds"] = f"{timed.seconds:.4f}"
        return Response(image, media_type="image/png", headers=headers)
    fmt = audio.value if audio is not None else None

    def analysis(job: Job) -> tuple[dict[str, Any], bytes, bytes]:
        body, encoded = analyze_upload(lm, upload.data, info, name, limits, job, fmt)
        # the JSON text in the worker too, in pieces (server.json_text): a 10-minute file's maps took 0.1 s to
        # serialise, stalling the event loop that every stream's hops wait on
        return body, json_bytes(body), encoded

    body, analysis_json, encoded = await state.jobs.run_until_gone(
        timed(analysis), lambda: client_gone(request)
    )
    state.metrics.audio_seconds.inc(body["duration_s"], route="/v1/analyze")
    headers["X-Audio-Duration"] = f"{body['duration_s']:.4f}"
    headers["X-Processing-Seconds"] = f"{timed.seconds:.4f}"
    if body["warnings"]:  # as /v1/enhance sends them
        headers["X-Enhance-Warning"] = warning_header(body["warnings"])
    if fmt is None:
        return Response(analysis_json, media_type="application/json", headers=headers)
    media, ext = OUTPUT_FORMATS[fmt][1], OUTPUT_FORMATS[fmt][2]
    content, content_type = multipart_form(
        [
            ("analysis", "application/json", analysis_json, None),
            ("audio", media, encoded, f"{safe_stem(upload.filename, 'upload')}.enhanced.{ext}"),
        ]
    )
    return Response(content, media_type=content_type, headers=headers)


@v1.get("/models", response_model=ModelsResponse, summary="The loaded models", responses=_errors(401, 503))
async def list_models(request: Request) -> ModelsResponse:
    store = request.app.state.store
    if store.status != "ready":
        store.get(None, request.app.state.config.retry_after_s)  # raises the 503
    return ModelsResponse(
        models=[
            ModelInfo(
                name=lm.name,
                default=lm.name == store.default,
                source=lm.source,
                config_name=lm.checkpoint.name,
                parameters=lm.parameters,
                sample_rate=lm.checkpoint.config.stft.sample_rate,
                n_mechanisms=lm.n_mechanisms,
                competition_blocks=lm.competition_blocks,
                latency_ms=lm.latency_ms,
                stream_backend=lm.stream_backend_name,
                stream_device=lm.stream_device,
            )
            for lm in store.models.values()
        ]
    )


@router.get(
    "/healthz",
    response_model=HealthResponse,
    summary="Liveness: the process answers, and its models are loaded or loading (503 once loading failed)",
    responses={
        503: {"model": HealthResponse, "description": "loading the models failed: restart the process"}
    },
)
async def healthz(request: Request) -> JSONResponse:
    """A failed load left a process that answered 200 here for good and 503 to everything else: a liveness
    probe never restarted it. Its reason is on /readyz (without server paths) and in the log."""
    failed = request.app.state.store.status == "failed"
    body = HealthResponse(status="failed" if failed else "ok")
    return JSONResponse(body.model_dump(), status_code=503 if failed else 200)


@router.get(
    "/readyz",
    response_model=ReadyResponse,
    summary="Readiness: 200 once the models are loaded, 503 before (or if loading failed)",
    responses={503: {"model": ReadyResponse, "description": "still loading, or loading failed"}},
)
async def readyz(request: Request) -> JSONResponse:
    store = request.app.state.store
    body = ReadyResponse(status=store.status, models=list(store.models), error=store.error)
    return JSONResponse(body.model_dump(), status_code=200 if store.status == "ready" else 503)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "text format 0.0.4"}
    },
)
async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE)


@router.get("/v1/stream", include_in_schema=False)
async def stream_over_http() -> None:
    """The stream is a WebSocket; a plain GET (a browser's address bar, curl) was told 404 "no such endpoint"."""
    raise ApiError(
        426,
        "websocket_required",
        "/v1/stream is a WebSocket endpoint: connect with ws:// or wss:// (see the service description at /docs)",
        headers={"Upgrade": "websocket", "Connection": "Upgrade"},
    )


def answer_head(routes: APIRouter) -> None:
    """Let every GET route of ``routes`` that has no HEAD answer HEAD too (uptime checkers, load balancers and
    ``curl -I`` send it; FastAPI said 405): a twin with the same endpoint and dependencies (so the API key still
    applies), kept out of the schema. The server sends a HEAD response's headers without its body."""
    inherited = len(routes.dependencies)  # add_api_route adds the router's own again
    for route in list(routes.routes):
        if isinstance(route, APIRoute) and route.methods == {"GET"}:
            routes.add_api_route(
                route.path.removeprefix(routes.prefix),
                route.endpoint,
                methods=["HEAD"],
                dependencies=route.dependencies[inherited:],
                response_model=route.response_model,
                response_class=route.response_class,
                include_in_schema=False,
                name=f"{route.name}_head",
            )


answer_head(router)
answer_head(v1)
