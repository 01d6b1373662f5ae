"""Reading an uploaded audio file from a request, within the size limit, as multipart or as the raw body.

The body is read by us (not by FastAPI's form handling) so that the byte limit holds however the client sends
it (Content-Length or chunked) and every problem becomes a structured 4xx.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from fastapi import Request
from python_multipart.multipart import parse_options_header
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect

from server.errors import ApiError
from server.jobs import client_gone_error

MULTIPART_OVERHEAD = 64 * 1024  # boundaries and part headers on top of the file itself
RAW_TYPES = ("application/octet-stream",)
UPLOAD_FIELD = "file"


@dataclass
class Upload:
    data: bytes
    filename: str | None
    media_type: str


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413, "payload_too_large", f"upload larger than the limit of {limit / 2**20:.3g} MiB ({limit} bytes)"
    )


async def _read_body(request: Request, cap: int, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None:
        try:
            if int(length) > cap:
                raise _too_large(limit)
        except ValueError:
            raise ApiError(400, "bad_request", "invalid Content-Length header") from None
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > cap:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def media_type_of(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def read_upload(request: Request, limit: int, timeout_s: float) -> Upload:
    """The audio file of a request: multipart field ``file``, or a raw ``audio/*`` / octet-stream body.

    A body that takes longer than ``timeout_s`` to arrive gets 408 (slow clients cannot hold a connection)."""
    try:
        return await asyncio.wait_for(_read_upload(request, limit), timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, "upload_timeout", f"the upload took longer than {timeout_s:g} s") from None
    except ClientDisconnect:  # the client gave up mid-upload: not a server error
        raise client_gone_error() from None


async def client_gone(request: Request) -> None:
    """Returns once the client has closed its connection (to be called after the body was read: the server then
    answers ``receive`` only with the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _read_upload(request: Request, limit: int) -> Upload:
    media = media_type_of(request)
    if media == "multipart/form-data":
        body = await _read_body(request, limit + MULTIPART_OVERHEAD, limit)
        data, filename, part_type = await _parse_multipart(request, body)
        if len(data) > limit:
            raise _too_large(limit)
    elif media.startswith("audio/") or media in RAW_TYPES:
        data, filename, part_type = await _read_body(request, limit, limit), None, media
    else:
        shown = media or "none"
        raise ApiError(
            415,
            "unsupported_media_type",
            f"Content-Type {shown[:80]} not accepted: send multipart/form-data with a '{UPLOAD_FIELD}' field, "
            "or the file itself as audio/* or application/octet-stream",
        )
    if not data:
        raise ApiError(400, "empty_body", "the upload is empty (0 bytes)")
    return Upload(data, filename, part_type)


def _closing_delimiter_missing(content_type: str, body: bytes) -> bool:
    """Whether a multipart body ends without its closing ``--boundary--`` (cut off in transit, or by the client):
    the parser takes what came as complete parts, and a file part cut mid-way read as "no file field"."""
    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if not boundary:
        return False  # the parser says what is wrong then
    return b"--" + boundary + b"--" not in body  # anywhere: an epilogue of any length may follow it


def _unescape_filename(name: str | None) -> str | None:
    """A multipart part's file name as the client's user named it: browsers (and httpx) send ``"``, CR and LF
    as ``%22``, ``%0D`` and ``%0A`` (the HTML standard's form encoding), and the download came back as
    ``a%2522b.enhanced.wav`` for ``a"b.wav``. Only those three are escaped, so only those are undone (a name
    with its own ``%41`` keeps it)."""
    if name is None:
        return None
    for escaped, char in (("%22", '"'), ("%0D", "\r"), ("%0A", "\n"), ("%0d", "\r"), ("%0a", "\n")):
        name = name.replace(escaped, char)
    return name


async def _parse_multipart(request: Request, body: bytes) -> tuple[bytes, str | None, str]:
    async def stream() -> AsyncGenerator[bytes, None]:
        yield body

    if _closing_delimiter_missing(request.headers.get("content-type", ""), body):
        raise ApiError(
            400, "bad_multipart", "malformed multipart body: it ends without its closing boundary (cut off?)"
        )

    parser = MultiPartParser(request.headers, stream(), max_files=1, max_fields=16, max_part_size=64 * 1024)
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        hint = ""
        # a text field over 64 KiB: nearly always audio sent without a filename
        if "maximum size" in exc.message:
            hint = f" (a text field: send the audio as a file part, e.g. curl -F '{UPLOAD_FIELD}=@x.wav')"
        raise ApiError(400, "bad_multipart", f"malformed multipart body: {exc.message}{hint}") from None
    except (ValueError, KeyError, AssertionError) as exc:
        raise ApiError(400, "bad_multipart", f"malformed multipart body ({type(exc).__name__})") from None
    try:
        part = form.get(UPLOAD_FIELD)
        if not isinstance(part, UploadFile):
            if part is not None:  # a part without a file name: curl -F 'file=<x.wav' instead of 'file=@x.wav'
                raise ApiError(
                    422,
                    "missing_file",
                    f"multipart field '{UPLOAD_FIELD}' is text, not a file (it has no filename); "
                    f"with curl: -F '{UPLOAD_FIELD}=@x.wav', not '{UPLOAD_FIELD}=<x.wav'",
                )
            raise ApiError(422, "missing_file", f"multipart body has no file field '{UPLOAD_FIELD}'")
        data = await part.read()
        media = (part.content_type or "application/octet-stream").split(";")[0].strip().lower()
        return data, _unescape_filename(part.filename), media
    finally:
        await form.close()
