"""Structured errors: every failure is ``{"error": {"code": "...", "message": "..."}}`` with a fitting status.

Routes raise :class:`ApiError`; the handlers installed by :func:`install_handlers` also turn FastAPI's
validation errors, Starlette's 404/405 and unexpected exceptions (500, no traceback) into the same shape.
Messages built from exceptions go through :func:`without_paths`: clients never see the server's directories.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("server")

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    408: "request_timeout",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    503: "unavailable",
    504: "timeout",
}


# an absolute path (/..., ~/..., C:\..., \\server\...) up to the next blank, quote or bracket
_ABS_PATH = re.compile(r"(?<![\w.~])(?:~|[A-Za-z]:)?[/\\][^\s'\"`,;()<>\[\]{}|]*")


def _last_part(path: str) -> str:
    parts = [p for p in re.split(r"[/\\]", path) if p]
    return parts[-1] if parts else path


def without_paths(text: str, known: Iterable[str] = ()) -> str:
    """``text`` fit for a client: each of the ``known`` paths (which may be relative or hold blanks), then every
    absolute path, cut to its last part (a file's name)."""
    for path in sorted({k for k in known if k}, key=len, reverse=True):
        text = text.replace(path, _last_part(path))
    return _ABS_PATH.sub(lambda m: _last_part(m.group(0)), text)


class ApiError(Exception):
    """An error reported to the client as structured JSON."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(error_body(exc.code, exc.message), status_code=exc.status, headers=exc.headers)


def _count_rejection(request: Request, code: str) -> None:
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.rejections.inc(reason=code)


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        _count_rejection(request, exc.code)
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = [
            {"loc": [str(p) for p in e.get("loc", ())], "message": str(e.get("msg", ""))}
            for e in exc.errors()
        ]
        first = details[0] if details else {"loc": [], "message": "invalid request"}
        message = f"{'.'.join(first['loc'])}: {first['message']}" if first["loc"] else str(first["message"])
        _count_rejection(request, "invalid_request")
        return JSONResponse(error_body("invalid_request", message, details=details), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _STATUS_CODES.get(exc.status_code, "http_error")
        message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such endpoint: {request.method} {request.url.path}"
        _count_rejection(request, code)
        return JSONResponse(
            error_body(code, message), status_code=exc.status_code, headers=dict(exc.headers or {})
        )

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body("internal_error", "internal server error"), status_code=500)
