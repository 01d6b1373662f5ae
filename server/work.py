"""The work behind the routes, as plain functions run in the job pool (see :mod:`server.jobs`).

They only call the project's APIs (``enhance.files.enhance_bytes``, ``enhance.audio_io``,
``enhance.competition_map``) and turn every problem with the client's audio into an :class:`ApiError`.
"""

from __future__ import annotations

import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from enhance.audio_io import AudioError, AudioInfo, codec_error, rate_range_error, read_info
from enhance.competition_map import entropy, frame_times, save_competition_map
from enhance.files import FileOptions, FileResult, enhance_bytes
from server.audio import OUTPUT_FORMATS, file_rms_dbfs
from server.errors import ApiError, without_paths
from server.jobs import Job
from server.registry import LoadedModel

_PLOT_LOCK = threading.Lock()  # pyplot is not thread-safe


@dataclass(frozen=True)
class Limits:
    max_duration_s: float
    max_channels: int
    # frames x channels: the encoded output is held in memory, and a small compressed upload can be hours of
    # audio at a high rate, so duration, channels and upload bytes alone do not bound it
    max_samples: int


def _reason(exc: BaseException, name: str) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"<[^<>]* object at 0x[0-9a-fA-F]+>", "the upload", text)  # no reprs of our objects
    return without_paths(text.replace("<stream>", name))[:300]  # e.g. a temporary file's path


def inspect_upload(data: bytes, name: str, limits: Limits) -> AudioInfo:
    """The upload's header, checked against the limits before any decoding (cheap)."""
    try:
        info = read_info(data)
    except AudioError as exc:
        # no header libsndfile knows: a client may convert the file and retry (the web page does)
        raise ApiError(422, "unsupported_format", _reason(exc, name)) from None
    problem = rate_range_error(info.sample_rate)
    if problem:  # the CLI says the same (enhance.audio_io.check_header)
        raise ApiError(422, "unsupported_sample_rate", f"{name}: {problem}")
    if info.channels > limits.max_channels:
        raise ApiError(
            422, "too_many_channels", f"{name}: {info.channels} channels; the limit is {limits.max_channels}"
        )
    if info.duration_s > limits.max_duration_s:
        raise ApiError(
            413,
            "audio_too_long",
            f"{name}: {info.duration_s:.1f} s of audio; the limit is {limits.max_duration_s:g} s",
        )
    if info.frames * info.channels > limits.max_samples:
        raise ApiError(
            413,
            "audio_too_large",
            f"{name}: {info.frames * info.channels / 1e6:.1f} million samples ({info.duration_s:.1f} s x "
            f"{info.channels} channels at {info.sample_rate} Hz); the limit is {limits.max_samples / 1e6:g} million",
        )
    return info


def _enhance(
    lm: LoadedModel,
    data: bytes,
    info: AudioInfo,
    name: str,
    job: Job,
    limits: Limits,
    *,
    out_format: str,
    out_subtype: str | None,
    with_competition: bool,
    high_band: bool = True,
) -> tuple[bytes, FileResult]:
    seen = 0
    # headers can lie about the length: stop once the decoded audio passes a limit (one block of slack)
    slack = 10.0 * info.sample_rate
    max_frames = (
        min(limits.max_duration_s * info.sample_rate, limits.max_samples / max(1, info.channels)) + slack
    )

    def progress(frames: int) -> None:
        nonlocal seen
        seen += frames
        job.check()
        if seen > max_frames:
            raise ApiError(
                413, "audio_too_long", f"{name}: more audio than the limit of {limits.max_duration_s:g} s"
            )

    try:
        return enhance_bytes(
            lm.checkpoint.model,
            data,
            name=name,
            out_format=out_format,
            out_subtype=out_subtype,
            options=FileOptions(with_competition=with_competition, high_band=high_band),
            on_progress=progress,
        )
    except (AudioError, ValueError, sf.LibsndfileError) as exc:
        raise ApiError(422, "invalid_audio", _reason(exc, name)) from None


def check_output(info: AudioInfo, name: str, fmt: str) -> None:
    """Refuse an output format that cannot hold the input's rate or channels (422), before anything runs."""
    problem = codec_error(OUTPUT_FORMATS[fmt][0], None, info.sample_rate, info.channels)
    if problem:
        raise ApiError(
            422,
            "unsupported_output",
            f"{name}: {problem} (the output keeps the input's rate and channels): ask for "
            + " or ".join(
                f"format={other}"
                for other, (container, _, _) in OUTPUT_FORMATS.items()
                if codec_error(container, None, info.sample_rate, info.channels) is None
            ),
        )


def enhance_upload(
    lm: LoadedModel,
    data: bytes,
    info: AudioInfo,
    name: str,
    fmt: str,
    limits: Limits,
    job: Job,
    high_band: bool = True,
    with_competition: bool = False,
) -> tuple[bytes, FileResult]:
    """Enhanced file in ``fmt`` (a key of OUTPUT_FORMATS, checked by :func:`check_output`) at the input's rate,
    channels and length; ``high_band``: see :mod:`enhance.high_band`."""
    return _enhance(
        lm,
        data,
        info,
        name,
        job,
        limits,
        out_format=OUTPUT_FORMATS[fmt][0],
        out_subtype=None,
        with_competition=with_competition,
        high_band=high_band,
    )


def _block_summary(block: int, maps: np.ndarray, digits: int = 4) -> dict[str, Any]:
    """One TIM block's maps of channel 0: [frames][n_s], mean entropy and how often each mechanism wins."""
    m = maps[0]
    n_s = m.shape[-1]
    wins = np.bincount(m.argmax(-1), minlength=n_s) / max(1, m.shape[0])
    return {
        "block": block,
        "maps": np.round(m.astype(np.float64), digits).tolist(),
        "mean_entropy": round(float(entropy(m).mean()) if m.shape[0] else 0.0, 5),
        "max_entropy": round(float(np.log(n_s)), 5),
        "win_share": [round(float(w), 4) for w in wins],
    }


def _enhance_with_maps(
    lm: LoadedModel, data: bytes, info: AudioInfo, name: str, job: Job, limits: Limits, fmt: str | None = None
) -> tuple[bytes, FileResult]:
    """Enhance for analysis, with the competition maps: in ``fmt`` (a key of OUTPUT_FORMATS, checked by
    :func:`check_output`) when the client takes the audio too, as /v1/enhance encodes it, else float WAV (levels
    are measured on it)."""
    if fmt is not None:
        return enhance_upload(lm, data, info, name, fmt, limits, job, with_competition=True)
    return _enhance(
        lm, data, info, name, job, limits, out_format="WAV", out_subtype="FLOAT", with_competition=True
    )


def analyze_upload(
    lm: LoadedModel,
    data: bytes,
    info: AudioInfo,
    name: str,
    limits: Limits,
    job: Job,
    audio_format: str | None = None,
) -> tuple[dict[str, Any], bytes]:
    """The analysis JSON (see ``schemas.AnalyzeResponse``) and the enhanced file: in ``audio_format`` (a key of
    OUTPUT_FORMATS) when given, the same file /v1/enhance gives, else float WAV."""
    t0 = time.perf_counter()
    encoded, result = _enhance_with_maps(lm, data, info, name, job, limits, audio_format)
    job.check()
    maps = result.competition or []
    stft = lm.checkpoint.config.stft
    n_frames = maps[0].shape[1] if maps else 0
    body = {
        "model": lm.name,
        "sample_rate": result.sample_rate,
        "channels": result.channels,
        "duration_s": round(result.duration_s, 4),
        "channel": 0,
        "n_mechanisms": lm.n_mechanisms,
        "hop_s": stft.hop_length / stft.sample_rate,
        "frame_times": [round(float(t), 4) for t in frame_times(n_frames, stft.hop_length, stft.sample_rate)],
        "blocks": [_block_summary(b, m) for b, m in zip(lm.competition_blocks, maps, strict=True)],
        "input_rms_dbfs": file_rms_dbfs(data),  # block by block: no float copy of either file
        "output_rms_dbfs": result.output_rms_dbfs,  # the enhanced samples, before the format clips or codes them
        "processing_seconds": round(time.perf_counter() - t0, 4),
        "warnings": result.warnings,
    }
    return body, encoded


NO_MATPLOTLIB = (
    "drawing PNG maps needs matplotlib on the server (pip install 'tim-enhance[viz]'); without format=png "
    "(and without Accept: image/png) the maps come back as JSON"
)


def _matplotlib_missing() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return True
    return False


def analyze_png(
    lm: LoadedModel, data: bytes, info: AudioInfo, name: str, limits: Limits, job: Job
) -> tuple[bytes, float]:
    """The competition maps drawn under the input's spectrogram (``enhance.competition_map``'s figure), and the
    duration of the audio that decoded (a truncated file's is shorter than its header says)."""
    if _matplotlib_missing():  # before the model runs, and with the API's alternative, not the CLI's (.npz)
        raise ApiError(406, "png_unavailable", NO_MATPLOTLIB)
    _, result = _enhance_with_maps(lm, data, info, name, job, limits)
    if not result.competition:
        raise ApiError(422, "no_competition", f"model '{lm.name}' has no TIM competition to draw")
    job.check()
    with tempfile.TemporaryDirectory(prefix="tim-analyze-") as tmp:
        target = Path(tmp) / "maps.png"
        try:
            with _PLOT_LOCK:
                save_competition_map(str(target), result.competition, lm.checkpoint, data, name)
        except ValueError:  # matplotlib missing (checked above; it could fail to import here all the same)
            raise ApiError(406, "png_unavailable", NO_MATPLOTLIB) from None
        return target.read_bytes(), result.duration_s
