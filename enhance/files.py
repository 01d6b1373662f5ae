"""Enhancing files: any format libsndfile reads, any rate, any channel count, any length, in bounded memory.

    input file --blocks--> soxr stream (-> 16 kHz) -> StreamingEnhancer -> soxr stream (-> input rate) --> temp file
         |                                                                                  + (rates > 16 kHz)    |
         +--> the band above 8 kHz, gated by the model's gain in 6-8 kHz (enhance.high_band) --+     rename onto output

The streaming engine is exact for any block size (its key/value caches carry the context), so blocks of
``block_seconds`` give the whole-file result in memory bounded by the block, at any duration.

The output keeps the input's rate, channel count, length and (where the output format allows) subtype. Nothing
is left behind on failure: the temp file is removed and an existing output is untouched.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import soundfile as sf

from enhance.atomic_files import atomic_path, nearest_existing
from enhance.audio_io import (
    MAX_FLOAT_SAMPLE,
    UNKNOWN_LENGTH,
    AudioError,
    check_header,
    check_readable,
    codec_error,
    format_fallback,
    fs_path,
    header_frames,
    missing,
    ogg_chain_length,
    open_audio,
    output_format,
    pcm_frames,
    read_blocks,
    read_info,
    reopen_audio,
    sample_value_error,
    short_reason,
)
from enhance.rate_bridge import RateBridge
from enhance.step_backend import StepBackend
from enhance.streaming import StreamingEnhancer
from models.enhancer import Enhancer

BLOCK_SECONDS = 10.0  # default audio per read and per model pass


@dataclass(frozen=True)
class FileOptions:
    """How a file is enhanced (the output's format and name apart): ``block_seconds`` of audio per read and model
    pass; ``stream_block`` (samples at 16 kHz) instead feeds the streaming engine that many samples at a time, as
    a live stream would (every block size gives the same samples, tested); ``with_competition``: keep the maps;
    ``backend``: the streaming engine's (:func:`enhance.backends.streaming_backend`; None: PyTorch);
    ``high_band``: above 16 kHz, keep the input's band above 8 kHz, gated by the model's gain near 8 kHz
    (:mod:`enhance.high_band`); False: the output holds the 16 kHz model's band only."""

    block_seconds: float = BLOCK_SECONDS
    stream_block: int | None = None
    with_competition: bool = False
    backend: StepBackend | None = None
    high_band: bool = True


@dataclass
class FileResult:
    input: str
    output: str | None
    ok: bool
    error: str | None = None
    sample_rate: int = 0
    channels: int = 0
    frames: int = 0
    wall_seconds: float = 0.0
    competition: list[np.ndarray] | None = field(default=None, repr=False)  # per TIM layer [C, T, n_s]
    # enhanced, but the user should know (a truncated input)
    warnings: list[str] = field(default_factory=list)
    # sum of the squared output samples (all channels) before any clipping or encoding, and their count: the
    # output level as enhanced, whatever the file holds (a 16-bit file clips, Ogg is lossy)
    output_energy: float = 0.0
    output_samples: int = 0

    @property
    def output_rms_dbfs(self) -> float | None:
        """RMS level of the enhanced samples in dB relative to full scale (None: silence), rounded to 0.01."""
        if not self.output_energy or not self.output_samples:
            return None
        return round(10.0 * math.log10(self.output_energy / self.output_samples), 2)

    @property
    def duration_s(self) -> float:
        return self.frames / self.sample_rate if self.sample_rate else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "output": self.output,
            "ok": self.ok,
            "error": self.error,
            "sample_rate": self.sample_rate,
            "channels": self.channels,
            "duration_s": round(self.duration_s, 3),
            "wall_seconds": round(self.wall_seconds, 3),
            "real_time_factor": round(self.wall_seconds / self.duration_s, 4) if self.duration_s else None,
            "warnings": self.warnings,
        }


# plain sample formats, carried into another container where it can hold them (codecs are not: WAV "can hold"
# MPEG_LAYER_III, but libsndfile cannot write it); one it cannot -> the nearest lower precision
_PLAIN = {"PCM_S8", "PCM_U8", "PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE"}
_NEAREST = {"DOUBLE": "FLOAT", "FLOAT": "PCM_24", "PCM_32": "PCM_24"}


def output_subtype(fmt: str, in_format: str, in_subtype: str) -> str | None:
    """The output's sample format: the input's in the same container; in another, the input's plain sample
    format where the container can hold it (24-bit FLAC -> 24-bit WAV), else the nearest lower precision it can
    (float WAV -> 24-bit FLAC); else None, the container's default (codecs, companded or lossy inputs)."""
    if fmt == in_format and sf.check_format(fmt, in_subtype):
        return in_subtype
    sub: str | None = in_subtype if in_subtype in _PLAIN else None
    while sub is not None:
        if sf.check_format(fmt, sub):
            return sub
        sub = _NEAREST.get(sub)
    return None


def enhance_stream(
    model: Enhancer,
    src: str | BinaryIO,
    dst: str | BinaryIO,
    *,
    name: str,
    out_format: str | None = None,
    out_subtype: str | None = None,
    options: FileOptions = FileOptions(),
    on_progress: Callable[[int], None] | None = None,
    format_chosen: bool = True,
) -> FileResult:
    """Enhance the audio of ``src`` into ``dst`` (both paths or file objects) as ``options`` say. Raises
    :class:`AudioError`. ``on_progress``: called with the frames of each block read. ``format_chosen=False``:
    ``out_format`` came from the output's name or a default, so an extensible WAV input stays extensible
    (:func:`extensible_kept`)."""
    t0 = time.perf_counter()
    block_seconds, stream_block = options.block_seconds, options.stream_block
    with_competition, backend, high_band = options.with_competition, options.backend, options.high_band
    check_readable(fs_path(src), name)
    try:
        fin = open_audio(fs_path(src))
    except Exception as exc:
        # not "Error opening <_io.BytesIO object at 0x...>"
        reason = short_reason(exc).replace(repr(src), "it")
        raise AudioError(f"{name}: not a readable audio file ({reason})") from None
    with fin:
        rate, channels, frames = fin.samplerate, fin.channels, fin.frames
        if frames == 0:  # a WAV whose recorder was cut off before it wrote the header's sizes reads so too
            raise AudioError(
                f"{name}: contains no samples (zero-length audio, or a header never completed by its recorder)"
            )
        # as load_audio says it (the engine's own check names no file)
        check_header(name, frames, channels, rate)
        declared = header_frames(fin)
        fmt = out_format or fin.format
        if not format_chosen:
            fmt = extensible_kept(fmt, fin.format, fin.subtype, out_subtype)
        if fmt not in sf.available_formats():
            raise AudioError(f"{name}: cannot write format {fmt}")
        subtype = out_subtype or output_subtype(fmt, fin.format, fin.subtype)
        if subtype is None and fmt == "RAW":
            raise AudioError(
                f"{name}: RAW output has no header: name its sample format with --subtype (e.g. PCM_16)"
            )
        if subtype is not None and not sf.check_format(fmt, subtype):
            raise AudioError(f"{name}: subtype {subtype} cannot be written in format {fmt}")
        # found now, not as libsndfile's error naming a temporary file (or, for Vorbis, a crash)
        problem = codec_error(fmt, subtype, rate, channels)
        if problem:
            raise AudioError(
                f"{name}: {problem} (outputs keep the input's rate and channels): write "
                f"{format_fallback(fmt, rate, channels)} instead"
            )
        clip = subtype is None or subtype not in ("FLOAT", "DOUBLE")
        engine = StreamingEnhancer(model, channels, with_competition, backend=backend)

        def run(x16: np.ndarray) -> np.ndarray:
            if stream_block is None or x16.shape[1] <= stream_block:
                return engine.process(x16)
            pieces = [
                engine.process(x16[:, i : i + stream_block]) for i in range(0, x16.shape[1], stream_block)
            ]
            return np.concatenate(pieces, axis=1)

        bridge = RateBridge(rate, channels, high_band=high_band)
        written = 0
        energy = 0.0
        decoded = 0
        peak = 0.0
        warnings = []
        if declared is not None:  # libsndfile already shortened frames to what the file holds
            warnings.append(
                f"{name}: the file ends after {frames} of the about {declared} frames its header gives (a truncated "
                f"file); the output holds the {frames} that are there"
            )
        chained = ogg_chain_length(fs_path(src)) if fin.format == "OGG" else 1
        if chained > 1:
            warnings.append(
                f"{name}: {chained} Ogg streams chained one after another; libsndfile reads the first only, so the "
                f"output holds its {frames / rate:.1f} s (split the file, e.g. with ffmpeg, to enhance the rest)"
            )
        try:
            fout = sf.SoundFile(fs_path(dst), "w", rate, channels, subtype, format=fmt)
        except (sf.LibsndfileError, ValueError) as exc:
            reason = _first_line(exc).replace(f"'{dst}'", "the output")  # not the temporary file's name
            if "Format not recognised" in reason:  # libsndfile's words for "cannot hold this audio"
                reason = (
                    reason.rstrip(".")
                    + f"; it cannot hold {channels} channel(s) at {rate} Hz: write "
                    + f"{format_fallback(fmt, rate, channels)} instead"
                )
            raise AudioError(f"{name}: cannot write {fmt}/{subtype or 'default'} output ({reason})") from None
        with fout:

            def write(y: np.ndarray) -> None:
                try:
                    fout.write(pcm_frames(y, fmt, subtype))
                except sf.LibsndfileError as exc:  # the disk, not the input (this said "corrupt audio data")
                    raise AudioError(
                        f"{name}: writing the output failed ({_first_line(exc).rstrip('.')}: a full disk, or a "
                        "file size limit?)"
                    ) from None

            def emit(y16: np.ndarray, last: bool = False) -> None:
                nonlocal written, energy
                y = bridge.from_model(y16, last).T[: frames - written]
                energy += float(np.sum(np.square(y, dtype=np.float64)))
                if clip:
                    y = np.clip(y, -1.0, 1.0)
                write(y)
                written += len(y)

            try:
                size = max(1, int(block_seconds * rate))
                blocks = read_blocks(fin, size, reopen=lambda: reopen_audio(src))
                for block in blocks:
                    block_peak = float(np.abs(block).max(initial=0.0))  # NaN carries through
                    if not block_peak <= MAX_FLOAT_SAMPLE:  # NaN, inf or not audio: say which
                        raise AudioError(f"{name}: {sample_value_error(block)}")
                    peak = max(peak, block_peak)
                    decoded += len(block)
                    emit(run(bridge.to_model(block.T)))
                    if on_progress is not None:
                        on_progress(len(block))
            except sf.LibsndfileError as exc:
                raise AudioError(f"{name}: corrupt audio data ({_first_line(exc)})") from None
            if decoded < frames:  # what decodes is enhanced, as sox and ffmpeg do, and the user is told
                if decoded == 0:
                    raise AudioError(
                        f"{name}: no audio decodes, though its header gives {frames} frames (corrupt?)"
                    )
                warnings.append(
                    f"{name}: the audio ends after {decoded} of the {frames} frames its header gives (a truncated "
                    f"or damaged file: decoding stopped there); the output holds the {decoded} that decode"
                )
                frames = decoded
            if peak == 0.0:  # enhanced like any audio (silence in, silence out), as load_audio takes it
                warnings.append(f"{name}: all samples are zero (digital silence)")
            tail = bridge.to_model(np.zeros((channels, 0), np.float32), last=True)
            rest = np.concatenate([run(tail), engine.flush()], axis=1)
            emit(rest, last=True)
            if written < frames:  # resampler rounding: pad the last few samples
                write(np.zeros((frames - written, channels), np.float32))
        # compressed formats encode their last packets in close(), where soundfile ignores a failed write (a full
        # disk left a cut FLAC/Ogg/MP3 behind with exit 0): the file must read back as long as what was written
        if isinstance(dst, str | os.PathLike) and fmt != "RAW":
            try:  # at least as long: block codecs (IMA/MS ADPCM, GSM 6.10, G.72x) pad their last block
                back = sf.info(fs_path(dst)).frames
                complete = frames <= back != UNKNOWN_LENGTH
            except Exception:
                complete = False
            if not complete:
                raise AudioError(
                    f"{name}: writing the output failed (it does not read back whole: a full disk, or a file "
                    "size limit?)"
                )
    return FileResult(
        name,
        None,
        True,
        sample_rate=rate,
        channels=channels,
        frames=frames,
        wall_seconds=time.perf_counter() - t0,
        competition=engine.competition() if with_competition else None,
        output_energy=energy,
        output_samples=frames * channels,
        warnings=warnings,
    )


@contextlib.contextmanager
def new_output(dst: str | os.PathLike[str], overwrite: bool) -> Iterator[str]:
    """:func:`atomic_path` for an output file: refused when ``dst`` exists unless ``overwrite``, also when another
    run wrote it while this one worked (its file is kept)."""
    if os.path.lexists(dst) and not overwrite:  # lexists: a link to a missing file is there too
        broken = "" if os.path.exists(dst) else ", a symbolic link to a missing file"
        raise AudioError(f"{dst}: output exists{broken} (use --overwrite)")
    blocked = nearest_existing(Path(dst).parent)
    if blocked is not None and not blocked.is_dir():  # it was "written meanwhile by another run"
        raise AudioError(f"{dst}: cannot be written, {blocked} is a file, not a folder")
    try:
        with atomic_path(dst, replace=overwrite) as tmp:
            yield tmp
    except FileExistsError:
        raise AudioError(
            f"{dst}: output exists (written meanwhile by another run; use --overwrite)"
        ) from None


def enhance_file(
    model: Enhancer,
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    out_format: str | None = None,
    out_subtype: str | None = None,
    options: FileOptions = FileOptions(),
    on_progress: Callable[[int], None] | None = None,
) -> FileResult:
    """Enhance file ``src`` into file ``dst`` atomically; refuses to overwrite unless asked, never the input.
    ``out_format``: the container (default: from ``dst``'s extension)."""
    src_p, dst_p = Path(src), Path(dst)
    if not src_p.exists():
        raise AudioError(f"{src}: {missing(src)}")
    if src_p.is_dir():
        raise AudioError(f"{src}: is a directory")
    if src_p.is_file() and src_p.stat().st_size == 0:  # a pipe has no size
        raise AudioError(f"{src}: empty file (0 bytes)")
    if dst_p.exists() and (dst_p.resolve() == src_p.resolve() or os.path.samefile(src_p, dst_p)):
        raise AudioError(f"{src}: refusing to overwrite the input file")
    read_info(src_p)  # an unreadable input is reported as such before anything about the output
    fmt, implied = (out_format.upper(), None) if out_format else output_format(dst_p)
    out_subtype = out_subtype or implied
    with new_output(dst_p, overwrite) as tmp:
        result = enhance_stream(
            model,
            str(src_p),
            tmp,
            name=str(src),
            out_format=fmt,
            out_subtype=out_subtype,
            options=options,
            on_progress=on_progress,
            format_chosen=bool(out_format),
        )
    result.output = str(dst_p)
    return result


def extensible_kept(fmt: str, in_format: str, in_subtype: str, out_subtype: str | None) -> str:
    """The container for an output whose format came from its name (or the WAV default), not from a choice:
    ``fmt``, but a .wav of a WAVE_FORMAT_EXTENSIBLE input stays so, with the speaker mask of its channel count
    (5.1 for 6; it came out plain, the mask gone), where WAVEX holds its sample format (not ADPCM or GSM)."""
    if fmt != "WAV" or in_format != "WAVEX":
        return fmt
    subtype = out_subtype or output_subtype("WAVEX", in_format, in_subtype)
    return "WAVEX" if subtype is None or sf.check_format("WAVEX", subtype) else fmt


def enhance_bytes(
    model: Enhancer,
    data: bytes,
    *,
    name: str = "<stdin>",
    out_format: str = "WAV",
    out_subtype: str | None = None,
    options: FileOptions = FileOptions(),
    on_progress: Callable[[int], None] | None = None,
    format_chosen: bool = True,
) -> tuple[bytes, FileResult]:
    """Enhance an encoded file held in memory; returns the encoded result. ``format_chosen=False``:
    ``out_format`` came from the output's name or a default, so an extensible WAV input stays extensible
    (:func:`extensible_kept`), as :func:`enhance_file` keeps it."""
    if not data:
        raise AudioError(f"{name}: empty input (0 bytes)")
    out = io.BytesIO()
    result = enhance_stream(
        model,
        io.BytesIO(data),
        out,
        name=name,
        out_format=out_format,
        out_subtype=out_subtype,
        options=options,
        on_progress=on_progress,
        format_chosen=format_chosen,
    )
    return out.getvalue(), result


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:160]
