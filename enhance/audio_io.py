"""Reading, checking, resampling and atomically writing audio.

Audio inside tim-enhance is float32 numpy ``[channels, samples]``; files keep their own rate, channel count and
subtype on the way out (see :class:`AudioInfo`). Every problem with a user's file becomes an :class:`AudioError`
with a one-line reason, never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import io
import mmap
import os
import re
import sys
import tempfile
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import soundfile as sf
import soxr

from enhance.atomic_files import atomic_path
from enhance.errors import AudioError

MODEL_RATE = 16000
OPUS_RATES = frozenset({8000, 12000, 16000, 24000, 48000})
VORBIS_MAX_RATE = 200_000  # libsndfile 1.2's Vorbis encoder crashes the process (SIGSEGV) above this
FLAC_MAX_RATE = 655_350  # the format's limit: libsndfile refuses to open a FLAC output above it
FLAC_MAX_CHANNELS, MP3_MAX_CHANNELS = 8, 2  # the formats' limits, as for the rate
MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)  # MPEG-1, -2 and -2.5 Layer III
# input rates enhanced (CLI, server, recipes): below 1 kHz a file is not speech the 16 kHz model can use, and
# 768 kHz is the highest rate audio interfaces record
MIN_RATE, MAX_RATE = 1000, 768_000
MAX_STREAM_RATE = 384_000  # a live stream's (WebSocket, raw pipe): its resamplers hold back more above it
MAX_FLOAT_SAMPLE = 1000.0  # float samples beyond this are not audio (the STFT of 3e38 overflows to NaN)
# file name suffixes treated as audio when scanning folders (CLI inputs, corpora, test sets)
AUDIO_SUFFIXES = frozenset(
    {".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aiff", ".aif", ".au", ".caf", ".w64", ".rf64"}
)


@dataclass(frozen=True)
class AudioInfo:
    """What a file was, so that the enhanced file can be written the same way."""

    sample_rate: int
    channels: int
    frames: int
    format: str  # libsndfile major format, e.g. "WAV", "FLAC", "OGG"
    subtype: str  # e.g. "PCM_16", "FLOAT", "VORBIS"

    @property
    def duration_s(self) -> float:
        return self.frames / self.sample_rate if self.sample_rate else 0.0


Source = str | os.PathLike[str] | BinaryIO | bytes


def fs_path(path: Any) -> Any:
    """A path as libsndfile can open it. A file name whose bytes are not valid UTF-8 comes to Python with
    surrogates in it, which soundfile's strict encoding of ``str`` paths refuses ("'utf-8' codec can't
    encode"): such a name goes as its original bytes. Anything else (a file object) is returned as it is."""
    if not isinstance(path, str | os.PathLike):
        return path
    text = os.fspath(path)
    if os.name == "nt":
        return text
    try:
        text.encode(sys.getfilesystemencoding())
    except UnicodeEncodeError:
        return os.fsencode(text)
    return text


def _open_source(source: Source) -> str | bytes | BinaryIO:
    if isinstance(source, bytes | bytearray):
        return io.BytesIO(source)
    if isinstance(source, str | os.PathLike):
        return fs_path(source)
    return source


def _name(source: Source) -> str:
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    return "<stream>"


def read_frames(f: sf.SoundFile) -> np.ndarray:
    """All of an open file's samples as float32 ``[samples, channels]``. Some codecs (GSM 6.10, G.721/G.723,
    NMS-ADPCM) are read only sequentially: soundfile then wants the frame count named, so it is, from the header."""
    return f.read(frames=-1 if f.seekable() else f.frames, dtype="float32", always_2d=True)


SALVAGE_FRAMES = 1024  # after a decoding error, the failed block is read again in pieces this long


def read_blocks(
    f: sf.SoundFile, blocksize: int, reopen: Callable[[], sf.SoundFile] | None = None
) -> Iterator[np.ndarray]:
    """An open file's samples as float32 ``[samples, channels]`` blocks of ``blocksize`` (the last one shorter),
    from where it stands to the end, also for the codecs that are read only sequentially (see
    :func:`read_frames`). A file that ends before the frame count its header gives (a truncated MP3, Ogg or
    FLAC) ends the blocks there: the caller sees fewer frames than ``f.frames`` (soundfile's own ``blocks()``
    went on to the header's count, yielding its reused buffer again: the output repeated stale audio).

    A cut FLAC does not end early but fails ("flac decoder lost sync"), and the failed read loses the whole
    block, leaving the handle unusable. With ``reopen`` (a new handle on the same audio) the blocks then end at
    the last frames that decode, as for a cut MP3: the failed block is read again from a new handle in pieces
    of :data:`SALVAGE_FRAMES`, up to the first that fails. Without it the error is raised."""
    position = f.tell() if f.seekable() else 0
    left = f.frames - position
    while left > 0:
        want = min(blocksize, left)
        try:
            block = f.read(want, dtype="float32", always_2d=True)
        except sf.LibsndfileError:
            if reopen is None:
                raise
            yield from _decodable(reopen, position, want)
            return
        if len(block):
            yield block
        if len(block) < want:
            return
        left -= want
        position += want


def _decodable(reopen: Callable[[], sf.SoundFile], position: int, frames: int) -> Iterator[np.ndarray]:
    """What decodes of ``frames`` frames from ``position``, read from a new handle in short pieces."""
    # (no new handle, e.g. on a stream that cannot seek back: the blocks end at the failed one)
    with contextlib.suppress(sf.LibsndfileError, OSError, RuntimeError, ValueError), reopen() as g:
        if g.seekable():
            g.seek(position)
        else:  # read only sequentially: read up to it
            skip = position
            while skip > 0:
                got = len(g.read(min(1 << 16, skip), dtype="float32", always_2d=True))
                if not got:
                    return
                skip -= got
        while frames > 0:
            piece = g.read(min(SALVAGE_FRAMES, frames), dtype="float32", always_2d=True)
            if len(piece):
                yield piece
            if len(piece) < min(SALVAGE_FRAMES, frames):
                return
            frames -= len(piece)


UNKNOWN_LENGTH = 2**63 - 1  # libsndfile's frame count for a header without a length (SF_COUNT_MAX)


def rate_range_error(rate: int) -> str | None:
    """Why input audio at ``rate`` Hz is not enhanced (None: it is): outside :data:`MIN_RATE`-:data:`MAX_RATE`."""
    if MIN_RATE <= rate <= MAX_RATE:
        return None
    return f"sample rate {rate} Hz is outside the {MIN_RATE}-{MAX_RATE} Hz that are enhanced"


def check_header(name: str, frames: int, channels: int | None = None, rate: int | None = None) -> None:
    """Refuse what a file's header already shows cannot be enhanced (raises :class:`AudioError`): no length (a
    FLAC encoded to a pipe can leave total_samples at 0: libsndfile then reports the largest count and fails at
    the first read), and, when given, more than :data:`MAX_CHANNELS` ``channels`` or a ``rate`` outside
    :func:`rate_range_error`'s range."""
    if frames == UNKNOWN_LENGTH:
        raise AudioError(
            f"{name}: its header gives no length (a FLAC encoded to a pipe?), which libsndfile cannot read; "
            "re-encode it to a file (e.g. ffmpeg -i in.flac out.flac)"
        )
    if channels is not None and channels > MAX_CHANNELS:
        raise AudioError(f"{name}: {channels} channels (at most {MAX_CHANNELS} are enhanced)")
    problem = None if rate is None else rate_range_error(rate)
    if problem:
        raise AudioError(f"{name}: {problem}")


def unreadable(path: Any) -> str | None:
    """Why a file that is there cannot be opened, where the OS says so (libsndfile's own words for it are
    "System error"): no read permission. None: readable, or not a path."""
    if isinstance(path, str | bytes) and os.path.isfile(path) and not os.access(path, os.R_OK):
        return "permission denied (cannot read it)"
    return None


def missing(path: Any) -> str:
    """Why an input that does not exist is missing: no such file, or a link whose target is gone (said so: "no
    such file" of a name that ls lists puzzled)."""
    if os.path.islink(path):
        try:
            os.stat(path)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return (
                    f"a link to {os.fsdecode(os.readlink(path))} that leads back to itself (a loop of links)"
                )
        return f"a link to {os.fsdecode(os.readlink(path))}, which does not exist"
    return "no such file"


def check_readable(path: Any, name: str) -> None:
    """Raise :class:`AudioError` naming ``name`` where :func:`unreadable` gives a reason."""
    reason = unreadable(path)
    if reason:
        raise AudioError(f"{name}: {reason}")


def _looks_like_mp3(head: bytes) -> bool:
    """An ID3v2 tag, or an MPEG audio frame's sync word with a layer set."""
    return head[:3] == b"ID3" or (
        len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0 and head[1] & 6 != 0
    )


_MPEG_KBPS = {  # (MPEG-1?, layer) -> bitrate (kbit/s) by index 1-14
    (True, 1): (32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 3): (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 1): (32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    (False, 3): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_MPEG_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def mpeg_frame(head: bytes) -> tuple[int, int] | None:
    """The length in bytes of the MPEG audio frame whose 4-byte header starts ``head``, and the header's fixed
    fields (version, layer, rate) as one number to compare with the next frame's; None if it is not a valid
    header (no sync word, a reserved version, layer or rate, a free or bad bitrate)."""
    if len(head) < 4 or head[0] != 0xFF or head[1] & 0xE0 != 0xE0:
        return None
    version, layer, index, rate_index = (
        (head[1] >> 3) & 3,
        4 - ((head[1] >> 1) & 3),
        head[2] >> 4,
        (head[2] >> 2) & 3,
    )
    if version == 1 or layer == 4 or not 1 <= index <= 14 or rate_index == 3:
        return None
    kbps, rate, padding = (
        _MPEG_KBPS[(version == 3, layer)][index - 1],
        _MPEG_RATES[version][rate_index],
        (head[2] >> 1) & 1,
    )
    if layer == 1:
        length = (12_000 * kbps // rate + padding) * 4
    else:
        length = (144_000 if layer == 2 or version == 3 else 72_000) * kbps // rate + padding
    return length, head[1] & 0xFE | rate_index << 8


def mpeg_stream(data: bytes) -> bool | None:
    """Whether ``data`` starts with two consecutive MPEG audio frames (an MP3 without an ID3 tag: its first
    header alone is also a plausible pair of PCM samples); None when a first valid header needs more bytes to
    tell."""
    first = mpeg_frame(data[:4])
    if first is None:
        return False
    length, fields = first
    if len(data) < length + 4:
        return None
    second = mpeg_frame(data[length : length + 4])
    return second is not None and second[1] == fields


# the first four bytes of the containers libsndfile reads, and what to call them in a message (MP3: encoded_kind)
CONTAINER_MAGIC = {
    b"RIFF": "WAV",
    b"RIFX": "WAV (big-endian)",
    b"RF64": "RF64",
    b"fLaC": "FLAC",
    b"OggS": "Ogg",
    b"FORM": "AIFF",
    b"caff": "CAF",
    b".snd": "AU",
    b"riff": "W64",
}
PIPE_CHECK_BYTES = 1 << 20  # a pipe's first MiB must show audio before the rest is read into memory


def encoded_kind(head: bytes) -> str | None:
    """What ``head`` (a file's first bytes) starts like: an audio container's name, or MP3 (an ID3 tag, or two
    MPEG frame headers a frame apart: one sync word alone is in about 1 of 2,700 random inputs); None: neither."""
    if head[:4] in CONTAINER_MAGIC:
        return CONTAINER_MAGIC[head[:4]]
    if head[:3] == b"ID3":
        return "MP3 (an ID3 tag)"
    return "MP3" if mpeg_stream(head) else None


def looks_encoded(head: bytes) -> bool:
    """Whether ``head`` starts like an encoded audio file (:func:`encoded_kind`)."""
    return encoded_kind(head) is not None


def read_piped(stream: BinaryIO, name: str) -> bytes:
    """An encoded file from a pipe (stdin, a named pipe, ``<(...)``), whole: a pipe cannot be read twice nor has
    it a size. Its first MiB is checked first: bytes that neither carry a header libsndfile reads nor start like
    a container are refused (raises :class:`AudioError`) before the rest is read (``/dev/zero`` or a producer's
    text went on filling memory until the kernel killed the process)."""
    head = b""
    while len(head) < PIPE_CHECK_BYTES:
        more = stream.read(PIPE_CHECK_BYTES - len(head))
        if not more:
            return head  # all of it: read as any file is
        head += more
    if not looks_encoded(head):
        try:
            read_info(head)
        except AudioError:
            raise AudioError(
                f"{name}: not a readable audio file (its first MiB holds no audio header libsndfile knows); "
                "nothing more was read"
            ) from None
    return head + stream.read()


def reopen_audio(src: Any) -> sf.SoundFile:
    """A new reading handle on ``src`` (a path, or a file object read from its start again), for
    :func:`read_blocks`' ``reopen``."""
    if hasattr(src, "seek"):
        src.seek(0)
    return open_audio(fs_path(src))


# libsndfile's log of a header whose chunk sizes run past the end of the file: "data : 64000 (should be 31978)"
_SHOULD_BE = re.compile(r"^\s*(data|SSND)\s*:\s*(\d+)\s*\(should be (\d+)\)", re.M)


def header_frames(fin: sf.SoundFile) -> int | None:
    """About how many frames the header of a cut WAV or AIFF file gives, when more than it holds (None
    otherwise). libsndfile quietly shortens such a file's ``frames`` to what is there, so a WAV cut in transit was
    enhanced without the warning a cut FLAC or MP3 gets. Read from libsndfile's log of the header: the audio
    chunk's size (data, SSND) against the bytes present. (W64 and RF64 log only their container's size, which a
    wrong but harmless field also shows: not read.)"""
    sizes = {name: (int(said), int(real)) for name, said, real in _SHOULD_BE.findall(fin.extra_info)}
    said, real = sizes.get("data") or sizes.get("SSND") or (0, 0)
    # a size near 2^31 or 2^32 is a streaming writer's "unknown" (ffmpeg and sox to a pipe), not a promise; one
    # byte over is a pad byte counted but not written
    if not 0 < real < said - 1 < 0x7FFF0000 or fin.frames == 0:
        return None
    return max(fin.frames + 1, round(fin.frames * said / real))


_OGG_PAGE = re.compile(rb"OggS\x00([\x00-\x07])")  # a page's capture pattern, version 0 and its flags


def ogg_chain_length(src: Any) -> int:
    """How many Ogg streams a file chains one after another (1: a plain file): a stream's first page (flag 2)
    after another's last (flag 4). libsndfile reads the first only: ``cat a.ogg b.ogg`` (joined takes, a radio
    dump) came out as a.ogg's audio alone, without a word. ``src``: a path, or a ``BytesIO``; 1 for others."""
    if isinstance(src, io.BytesIO):
        return _chained(src.getbuffer())
    if not isinstance(src, str | bytes | os.PathLike) or not os.path.isfile(src):
        return 1
    with open(src, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return 1
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _chained(data)


def _chained(data: Any) -> int:
    streams, ended = 1, False
    for page in _OGG_PAGE.finditer(data):
        flags = page.group(1)[0]
        if flags & 2 and ended:
            streams, ended = streams + 1, False
        ended = ended or bool(flags & 4)
    return streams


def open_audio(src: Any) -> sf.SoundFile:
    """``sf.SoundFile(src)`` for reading, also for an MP3 held in memory. libsndfile recognises MP3 by its file
    name's extension where its sniffing of the content fails (MPEG frames without a Xing header, an ID3 tag:
    "bad data offset", "bad resource fork"), and memory has no name, so the server refused MP3 uploads that the
    CLI read from disk. Such bytes are opened from a temporary ``.mp3`` file, removed once libsndfile holds it
    open (at close where the OS cannot remove an open file)."""
    start = src.tell() if isinstance(src, io.IOBase) and src.seekable() else None
    try:
        f = sf.SoundFile(src)
    except Exception as first:
        if not isinstance(src, io.BytesIO) or not _looks_like_mp3(bytes(src.getbuffer()[:4])):
            raise
        try:
            fd, tmp = tempfile.mkstemp(suffix=".mp3")
        except OSError:  # no temporary folder to write to: libsndfile's own words stand
            raise first from None
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(src.getbuffer())
            f = sf.SoundFile(tmp)
        except Exception:  # not MP3 after all (or the copy failed): the first error says what is wrong
            os.unlink(tmp)
            raise first from None
        except BaseException:
            os.unlink(tmp)
            raise
    else:
        if (
            f.subtype.startswith("DWVW")
            and f.seekable()
            and (start is not None or not isinstance(src, io.IOBase))
        ):
            f.close()  # again, read in order (see SequentialFile)
            if start is not None:
                src.seek(start)
            return SequentialFile(src)
        return f
    try:
        os.unlink(tmp)
    except OSError:  # Windows: not while it is open
        weakref.finalize(f, _remove_quietly, tmp)
    return f


class SequentialFile(sf.SoundFile):
    """A file read front to back only. libsndfile says a DWVW-coded AIFF can seek, but every seek fails, and
    soundfile seeks around each read ("Internal psf_fseek() failed."): such a file, which enhance-cli itself
    writes with ``--subtype DWVW_16``, was refused as corrupt. Read as not seekable, as GSM is (see
    :func:`read_frames`), all of it decodes."""

    def seekable(self) -> bool:
        return False


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def read_info(source: Source) -> AudioInfo:
    """Header of an audio file without reading the samples (raises :class:`AudioError`)."""
    src = _open_source(source)
    if isinstance(src, str | bytes) and not os.path.exists(src):
        raise AudioError(f"{_name(source)}: {missing(src)}")
    check_readable(src, _name(source))
    try:
        with open_audio(src) as f:
            info = AudioInfo(f.samplerate, f.channels, f.frames, f.format, f.subtype)
    except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
        raise AudioError(f"{_name(source)}: not a readable audio file ({short_reason(exc)})") from None
    check_header(_name(source), info.frames)
    return info


def load_audio(source: Source) -> tuple[np.ndarray, AudioInfo]:
    """Read a file as float32 ``[channels, samples]`` and check it can be enhanced.

    Raises :class:`AudioError` for missing, unreadable or corrupt files, zero-length audio and NaN/inf samples.
    (All-zero audio is valid input: it is enhanced to silence.)
    """
    src = _open_source(source)
    name = _name(source)
    if isinstance(src, str | bytes):
        if not os.path.exists(src):
            raise AudioError(f"{name}: {missing(src)}")
        if os.path.isdir(src):
            raise AudioError(f"{name}: is a directory")
        if os.path.isfile(src) and os.path.getsize(src) == 0:  # a pipe has no size
            raise AudioError(f"{name}: empty file (0 bytes)")
        check_readable(src, name)
    try:
        with open_audio(src) as f:
            info = AudioInfo(f.samplerate, f.channels, f.frames, f.format, f.subtype)
            check_header(name, info.frames, info.channels, info.sample_rate)
            data = read_frames(f)
    except AudioError:
        raise  # already says what is wrong (it is a ValueError too)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise AudioError(f"{name}: not a readable audio file ({short_reason(exc)})") from None
    wav = np.ascontiguousarray(data.T)
    check_audio(wav, name)
    return wav, AudioInfo(info.sample_rate, info.channels, wav.shape[1], info.format, info.subtype)


# more "channels" than this is nearly always a [samples, channels] array (soundfile's layout)
MAX_CHANNELS = 64


def sample_layout_error(wav: np.ndarray, expected: str) -> str | None:
    """Why an array is not float audio laid out as ``expected`` (None: it is): integer PCM, which the model
    would take as values 32768 times too loud (it depends on level), or soundfile's [samples, channels]."""
    if not np.issubdtype(wav.dtype, np.floating):
        pcm = wav.dtype in (np.int16, np.int32)
        hint = f" (integer PCM: divide by {2 ** (8 * wav.dtype.itemsize - 1)})" if pcm else ""
        return f"expected float samples in [-1, 1], got dtype {wav.dtype}{hint}"
    if wav.ndim != 2 or wav.shape[0] == 0:
        return f"expected {expected} audio, got shape {tuple(wav.shape)}"
    if wav.shape[0] > MAX_CHANNELS:
        return (
            f"expected {expected} audio, got shape {tuple(wav.shape)}: {wav.shape[0]} channels is more than "
            f"{MAX_CHANNELS}; for soundfile's [samples, channels] arrays pass wav.T"
        )
    return None


def sample_value_error(wav: np.ndarray) -> str | None:
    """Why these samples cannot be enhanced (None: they can): NaN or infinite ones, or values beyond
    ±:data:`MAX_FLOAT_SAMPLE` (a float file is expected within about ±1; 3e38 came out as NaN)."""
    peak = float(np.abs(wav).max(initial=0.0))  # one pass: NaN and inf carry through the maximum
    if np.isfinite(peak) and peak <= MAX_FLOAT_SAMPLE:
        return None
    if not np.isfinite(wav).all():
        return f"{int((~np.isfinite(wav)).sum())} sample(s) are NaN or infinite"
    beyond = int((np.abs(wav) > MAX_FLOAT_SAMPLE).sum())
    return f"{beyond} sample(s) beyond ±{MAX_FLOAT_SAMPLE:g} (float audio is expected within about ±1)"


def check_chunk(chunk: np.ndarray, channels: int) -> None:
    """Refuse (ValueError) a streamed chunk that is not float ``[channels, n]`` samples within
    ±:data:`MAX_FLOAT_SAMPLE` and finite: what :meth:`enhance.streaming.StreamingEnhancer.process` takes, and
    what :class:`enhance.rate_bridge.RateBridge` checks before its resampler takes anything in (it took int16
    PCM as floats 32768 times too loud, and a NaN chunk, whose resampled NaN the engine then refused in the
    next, valid chunks)."""
    if not np.issubdtype(chunk.dtype, np.floating):
        raise ValueError(sample_layout_error(chunk, f"[{channels}, n]"))
    if chunk.ndim != 2 or chunk.shape[0] != channels:
        transposed = chunk.ndim == 2 and chunk.shape[1] == channels
        hint = (
            " (for [n, channels] arrays, such as soundfile's and sounddevice's, pass chunk.T)"
            if transposed
            else ""
        )
        raise ValueError(f"expected [{channels}, n] samples, got {tuple(chunk.shape)}{hint}")
    problem = sample_value_error(chunk)  # before any cast: 1e39 in float64 is inf in float32
    if problem:
        raise ValueError(f"chunk: {problem}")


def check_audio(wav: np.ndarray, name: str = "<audio>") -> None:
    """Refuse what cannot be enhanced: not float [channels, samples] (see :func:`sample_layout_error`), no
    samples, or NaN/inf samples or ones beyond ±:data:`MAX_FLOAT_SAMPLE`."""
    problem = sample_layout_error(wav, "[channels, samples]")
    if problem:
        raise AudioError(f"{name}: {problem}")
    if wav.shape[1] == 0:
        raise AudioError(f"{name}: contains no samples (zero-length audio)")
    problem = sample_value_error(wav)
    if problem:
        raise AudioError(f"{name}: {problem}")


def load_mono_16k(source: Source) -> tuple[np.ndarray, int, int]:
    """Channel 0 of an audio file at 16 kHz as float32 ``[samples]``, with the file's rate and channel count.

    Raises :class:`AudioError` for unreadable, empty or non-finite files.
    """
    wav, info = load_audio(source)
    return resample(wav[:1], info.sample_rate, MODEL_RATE)[0], info.sample_rate, info.channels


def whole_rate(rate: float) -> int:
    """A sample rate as an int: 44100.0 is 44100 (a float rate crashed the high band's indexing); 44100.5, 0 and
    negative ones are refused."""
    number = isinstance(rate, int | float | np.integer | np.floating) and not isinstance(rate, bool)
    if not number or not float(rate).is_integer() or rate < 1:  # (a str "16000" was a TypeError from '<')
        raise ValueError(f"sample_rate must be a whole number of Hz above 0, got {rate!r}")
    return int(rate)


def resample(wav: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Resample ``[channels, samples]`` float32 with soxr (high quality); identity when the rates match."""
    if rate_in == rate_out:
        return wav
    if wav.dtype not in (np.float32, np.float64):  # soxr takes float32/64 and int16/32 only (float16 failed)
        wav = wav.astype(np.float32)
    out = soxr.resample(np.ascontiguousarray(wav.T), rate_in, rate_out, quality="HQ")
    return np.ascontiguousarray(np.asarray(out, dtype=np.float32).reshape(-1, wav.shape[0]).T)


def fit_length(wav: np.ndarray, length: int) -> np.ndarray:
    """Cut or zero-pad ``[channels, samples]`` to exactly ``length`` samples (resampling round trips drift by 1)."""
    n = wav.shape[1]
    if n == length:
        return wav
    if n > length:
        return wav[:, :length]
    return np.pad(wav, ((0, 0), (0, length - n)))


def codec_error(fmt: str, subtype: str | None, rate: int, channels: int = 1) -> str | None:
    """Why audio at ``rate`` with ``channels`` cannot be written in container ``fmt`` with codec ``subtype``
    (None: the container's default), found before writing (None: it can): Opus takes five rates, libsndfile's
    Vorbis encoder crashes the whole process above :data:`VORBIS_MAX_RATE` instead of failing, and FLAC and
    MP3 hold few channels (libsndfile's own error, "Format not recognised", named the temporary file)."""
    for container, most in (("FLAC", FLAC_MAX_CHANNELS), ("MP3", MP3_MAX_CHANNELS)):
        if fmt == container and channels > most:
            return f"{container} holds at most {most} channels and this has {channels}"
    if subtype == "OPUS" and rate not in OPUS_RATES:
        return f"Opus takes 8, 12, 16, 24 or 48 kHz audio and this is {rate} Hz"
    if fmt == "OGG" and subtype in (None, "VORBIS") and rate > VORBIS_MAX_RATE:
        return f"Ogg Vorbis takes audio up to {VORBIS_MAX_RATE // 1000} kHz and this is {rate} Hz"
    if fmt == "FLAC" and rate > FLAC_MAX_RATE:
        return f"FLAC takes audio up to {FLAC_MAX_RATE} Hz and this is {rate} Hz"
    if fmt == "MP3" and rate not in MP3_RATES:
        return f"MP3 takes 8, 11.025, 12, 16, 22.05, 24, 32, 44.1 or 48 kHz audio and this is {rate} Hz"
    stored = None if fmt in EXACT_RATE_CONTAINERS else _stored_rate(fmt, subtype, rate, channels)
    if stored is not None and stored != rate:
        return f"{fmt} cannot store {rate} Hz (its header would say {stored} Hz: the audio would play at the wrong speed)"
    return None


# containers whose headers hold any rate they take exactly (the others are probed by _stored_rate)
EXACT_RATE_CONTAINERS = frozenset({"WAV", "WAVEX", "W64", "RF64", "FLAC", "OGG", "MP3", "AIFF", "CAF", "AU"})


def _stored_rate(fmt: str, subtype: str | None, rate: int, channels: int) -> int | None:
    """The rate a one-frame file of ``fmt`` written at ``rate`` says it has (None: the probe failed, and the real
    write will say why). libsndfile writes some containers at another rate without an error: SVX and MPC2K keep
    it in 16 bits (96 kHz read back as 30464), WVE is always 8 kHz and XI 44.1 kHz, HTK and SDS store a period
    (22050 read back as 22075): the output played at the wrong speed, and the run said it succeeded."""
    buf = io.BytesIO()
    try:
        with sf.SoundFile(buf, "w", rate, channels, subtype, format=fmt) as f:
            f.write(np.zeros((1, channels), np.float32))
        return int(sf.info(io.BytesIO(buf.getvalue())).samplerate)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError):
        return None


def format_fallback(fmt: str, rate: int, channels: int = 1) -> str:
    """The containers to suggest when ``fmt`` cannot hold audio at ``rate`` with ``channels`` (after
    :func:`codec_error`)."""
    flac_cannot = fmt == "FLAC" or rate > FLAC_MAX_RATE or channels > FLAC_MAX_CHANNELS
    return ".wav" if flac_cannot else ".flac or .wav"


def _check_codec(fmt: str, subtype: str | None, rate: int, channels: int) -> None:
    problem = codec_error(fmt, subtype, rate, channels)
    if problem:
        raise AudioError(problem)


# integer PCM subtypes and their bits
PCM_BITS = {"PCM_S8": 8, "PCM_U8": 8, "PCM_16": 16, "PCM_24": 24, "PCM_32": 32}
_PCM_BLOCK = 1 << 16  # frames converted at a time (bounds the float temporary)


def pcm_frames(frames: np.ndarray, fmt: str, subtype: str | None) -> np.ndarray:
    """``[frames, channels]`` float samples as soundfile should get them for ``fmt``/``subtype`` (None: the
    container's default): for an integer PCM subtype, integers rounded to the nearest step of that subtype and
    clipped to its range, which soundfile writes exactly (int16 for 8 and 16 bits, the 8-bit value in the top byte;
    int32 for 24 and 32 bits, the 24-bit value in the top three bytes); other subtypes unchanged. libsndfile
    (1.2.2) converts float to 16- and 24-bit WAV and AIFF by rounding down (0.7 of a step to 0, -0.3 to -1: a
    half-step offset and 4x the rounding error's power), though it rounds FLAC. Every integer output goes through
    here: files, HTTP responses, the raw pipe (``"RAW"``) and the WebSocket stream's s16le."""
    bits = PCM_BITS.get(subtype or sf.default_subtype(fmt) or "")
    if bits is None:
        return np.ascontiguousarray(frames)
    x = np.asarray(frames)
    wide = bits > 16
    out = np.empty(x.shape, np.int32 if wide else np.int16)
    full, shift = float(1 << (bits - 1)), (32 if wide else 16) - bits
    calc = np.float64 if bits == 32 else np.float32  # float32 holds every 24-bit step exactly
    for i in range(0, len(x), _PCM_BLOCK):
        y = np.multiply(x[i : i + _PCM_BLOCK], full, dtype=calc)
        np.round(y, out=y)
        np.clip(y, -full, full - 1, out=y)
        out[i : i + _PCM_BLOCK] = y
    if shift:
        out <<= shift
    return out


def save_audio(
    path: str | os.PathLike[str],
    wav: np.ndarray,
    sample_rate: int,
    *,
    format: str | None = None,
    subtype: str | None = None,
) -> None:
    """Write ``[channels, samples]`` float audio atomically (temp file + rename).

    ``format``/``subtype`` default to what the file extension implies (libsndfile's defaults). Integer subtypes
    are rounded to their nearest step and clipped to [-1, 1] (:func:`pcm_frames`).
    """
    fmt, implied = (format, None) if format else output_format(path)
    subtype = subtype or implied
    if subtype is not None and not sf.check_format(fmt, subtype):
        subtype = None  # e.g. VORBIS -> WAV: fall back to the container's default
    _check_codec(fmt, subtype, sample_rate, wav.shape[0])
    with atomic_path(path) as tmp:
        sf.write(fs_path(tmp), pcm_frames(wav.T, fmt, subtype), sample_rate, format=fmt, subtype=subtype)


def refused_container(fmt: str) -> str | None:
    """Why a container libsndfile writes is not written here (None: it is): SD2, whose resource fork libsndfile
    puts in a separate "._" file that the rename onto the output leaves behind (and the output unreadable)."""
    return "SD2 files are not written (use .aiff or .wav)" if fmt.upper() == "SD2" else None


def output_format(path: str | os.PathLike[str]) -> tuple[str, str | None]:
    """The container a file name asks for, and the codec its extension implies (``.opus``: Ogg with Opus, not
    libsndfile's default Vorbis; else None). Raises :class:`AudioError` for an extension libsndfile cannot write,
    and for ``.raw``, which names no sample format (a RAW output needs an explicit format and subtype)."""
    suffix = Path(path).suffix
    fmt = suffix.lstrip(".").upper()
    aliases = {"WAVE": "WAV", "AIF": "AIFF", "OGA": "OGG", "OPUS": "OGG"}
    fmt = aliases.get(fmt, fmt)
    refused = refused_container(fmt)
    if refused:
        raise AudioError(f"{path}: {refused}")
    if fmt == "RAW":
        raise AudioError(
            f"{path}: a .raw file names no sample format: add --format RAW --subtype PCM_16 (or FLOAT)"
        )
    if fmt not in sf.available_formats():
        raise AudioError(
            f"{path}: cannot write '{suffix or '(no extension)'}' files; use .wav, .flac, .ogg, .opus, .mp3, .aiff "
            "(or --format)"
        )
    return fmt, "OPUS" if suffix.lower() == ".opus" else None


# what libsndfile says of a file it opened but recognises no format in, e.g. an MP3 cut to a few hundred bytes
_NOT_REGULAR = "File does not exist or is not a regular file (possibly a pipe?)."


def short_reason(exc: BaseException) -> str:
    """The first line of a reading error, libsndfile's misleading words for a file it cannot make out replaced."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if text.endswith(_NOT_REGULAR):  # the file exists (checked before) and is a file or a pipe already read
        return "no format libsndfile decodes: cut short or damaged?"
    return text[:160]
