"""Audio helpers of the HTTP layer: output-format negotiation, raw PCM for streams, levels, safe file names."""

from __future__ import annotations

import io
import math
import re
import secrets
import unicodedata
import urllib.parse
from collections.abc import Iterable

import numpy as np

from enhance.audio_io import open_audio, read_blocks
from server.errors import ApiError

# output format (query value) -> (libsndfile format, media type, file extension)
OUTPUT_FORMATS: dict[str, tuple[str, str, str]] = {
    "wav": ("WAV", "audio/wav", "wav"),
    "flac": ("FLAC", "audio/flac", "flac"),
    "ogg": ("OGG", "audio/ogg", "ogg"),
}
_ACCEPT_ALIASES = {
    "audio/wav": "wav",
    "audio/x-wav": "wav",
    "audio/wave": "wav",
    "audio/vnd.wave": "wav",
    "audio/flac": "flac",
    "audio/x-flac": "flac",
    "audio/ogg": "ogg",
    "application/ogg": "ogg",
    "audio/*": "wav",
    "*/*": "wav",
}

# /v1/analyze's formats (query value) -> media type, in the order preferred on a tie
ANALYZE_FORMATS = {"json": "application/json", "png": "image/png"}


def accept_entries(accept: str) -> list[tuple[str, float]]:
    """``(media range, q)`` of each entry of an Accept header, in its order; a q that is not a finite number is 0
    (the entry refuses rather than wins)."""
    entries: list[tuple[str, float]] = []
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        entries.append((media.lower(), q if math.isfinite(q) else 0.0))
    return entries


def not_acceptable(accept: str, offered: Iterable[str]) -> ApiError:
    """The 406 of a route that can produce none of what ``accept`` allows: one body for every route."""
    return ApiError(
        406, "not_acceptable", f"cannot produce any of Accept: {accept[:100]}; offered: {', '.join(offered)}"
    )


def negotiate_audio_format(query_format: str | None, accept: str | None) -> str:
    """``?format=`` wins; otherwise the best ``Accept`` entry we can produce; WAV when neither says. 406 else."""
    if query_format:
        return query_format
    if not accept or not accept.strip():
        return "wav"
    entries = accept_entries(accept)
    # q=0 refuses a format, also where a wildcard would otherwise stand for it ("audio/wav;q=0, */*")
    refused = {_ACCEPT_ALIASES[m] for m, q in entries if q <= 0 and m in _ACCEPT_ALIASES and "*" not in m}
    choices: list[tuple[float, int, str]] = []
    for i, (media, q) in enumerate(entries):
        if q <= 0 or media not in _ACCEPT_ALIASES:
            continue
        if "*" in media:  # the first format in our order that was not refused
            fmt = next((f for f in OUTPUT_FORMATS if f not in refused), None)
        else:
            fmt = _ACCEPT_ALIASES[media]
        if fmt is not None and fmt not in refused:
            choices.append((-q, i, fmt))
    if not choices:
        raise not_acceptable(accept, (OUTPUT_FORMATS[f][1] for f in OUTPUT_FORMATS))
    return min(choices)[2]


def _quality(media: str, entries: list[tuple[str, float]]) -> tuple[float, bool]:
    """The q that ``entries`` give the media type ``media``, from the most specific range that names it (RFC 9110
    12.5.1: "image/png;q=0, */*" refuses PNG), and whether that range named it exactly."""
    kind = media.split("/")[0]
    for candidate in (media, f"{kind}/*", "*/*"):
        qs = [q for m, q in entries if m == candidate]
        if qs:
            return max(qs), candidate == media
    return 0.0, False


def negotiate_analyze_format(query_format: str | None, accept: str | None) -> str:
    """/v1/analyze's format, json or png: ``?format=`` wins, as on /v1/enhance; otherwise the type the Accept
    header ranks highest, one it names exactly before one a wildcard covers, JSON on a tie and without a header.
    406 when it allows neither (Accept: text/html was answered JSON, while /v1/enhance refused what it could not
    produce)."""
    if query_format:
        return query_format
    if not accept or not accept.strip():
        return "json"
    entries = accept_entries(accept)
    ranked = []
    for order, (fmt, media) in enumerate(ANALYZE_FORMATS.items()):
        q, exact = _quality(media, entries)
        if q > 0:
            ranked.append((-q, not exact, order, fmt))
    if not ranked:
        raise not_acceptable(accept, ANALYZE_FORMATS.values())
    return min(ranked)[3]


def file_rms_dbfs(data: bytes, block_frames: int = 1 << 16) -> float | None:
    """RMS level of all samples (all channels) of an encoded file in dB relative to full scale (a full-scale sine
    is -3 dBFS), read block by block in bounded memory; None for silence."""
    total, count = 0.0, 0
    with open_audio(io.BytesIO(data)) as f:  # as far as it decodes, as it was enhanced
        for block in read_blocks(f, block_frames, reopen=lambda: open_audio(io.BytesIO(data))):
            total += float(np.sum(np.square(block, dtype=np.float64)))
            count += block.size
    rms = math.sqrt(total / count) if count else 0.0
    return round(20.0 * math.log10(rms), 2) if rms > 0 else None


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _client_base(filename: str) -> str:
    """A client's file name without its directories (either slash)."""
    return re.split(r"[\\/]", filename)[-1]


def _client_stem(filename: str) -> str:
    """A client's file name without its directories and its extension."""
    base = _client_base(filename)
    return base.rsplit(".", 1)[0] if "." in base.strip(".") else base


def download_disposition(filename: str | None, stem: str, suffix: str) -> str:
    """``Content-Disposition`` for a download named ``stem + suffix`` (``stem``: :func:`safe_stem`), with the
    client's own name, non-ASCII letters and spaces kept, as RFC 6266's ``filename*`` where it differs ("ünï
    köö.flac" came back as "n_k.enhanced.wav" only)."""
    header = f'attachment; filename="{stem}{suffix}"'
    full = _client_stem(filename or "")
    full = "".join(c for c in full if unicodedata.category(c)[0] != "C").strip(" .")[:80]  # no control chars
    if full and full != stem:
        header += f"; filename*=UTF-8''{urllib.parse.quote(full + suffix, safe='')}"
    return header


def safe_name(filename: str | None, default: str = "upload") -> str:
    """A client's file name as the server's messages give it: no directories, no odd characters, but with its
    extension ("bad.wav: not a readable audio file"; the stem alone, "bad: ...", read as another file)."""
    if not filename:
        return default
    base = unicodedata.normalize("NFC", _client_base(filename))  # macOS names are decomposed (NFD)
    kept = "".join(c if c in " ._-" or unicodedata.category(c)[0] in "LMN" else "_" for c in base)
    name = re.sub("_+", "_", kept).strip("_- ")[:100]
    return name if name.strip(".") else default


def safe_stem(filename: str | None, default: str = "audio") -> str:
    """A harmless file stem from a client's file name (no directories, no odd characters), for headers only."""
    if not filename:
        return default
    stem = _UNSAFE.sub("_", _client_stem(filename)).strip("._-")[:80]
    return stem or default


def multipart_form(parts: list[tuple[str, str, bytes, str | None]]) -> tuple[bytes, str]:
    """A ``multipart/form-data`` body (RFC 7578) of ``(name, media type, content, file name or None)`` parts, and
    its Content-Type; a browser reads it with ``Response.formData()``. The boundary is random and checked absent
    from every part."""
    while True:
        boundary = f"tim-enhance-{secrets.token_hex(16)}"
        if not any(boundary.encode() in content for _, _, content, _ in parts):
            break
    body = bytearray()
    for name, media, content, filename in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        body += (
            f"--{boundary}\r\nContent-Disposition: {disposition}\r\nContent-Type: {media}\r\n\r\n".encode()
        )
        body += content + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    return bytes(body), f"multipart/form-data; boundary={boundary}"


def warning_header(warnings: list[str]) -> str:
    """``X-Enhance-Warning``: the run's warnings in one line, cut to 1000 characters (a header holds latin-1
    only, so in ASCII)."""
    return "; ".join(warnings)[:1000].encode("ascii", "replace").decode()
