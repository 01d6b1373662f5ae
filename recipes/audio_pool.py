"""A checked set of audio files for dynamic mixing.

Scanning reads every file's header (and, for short files, its samples) and sets aside, with the path and the
reason, every file that is corrupt, at the wrong sample rate, too short or digitally silent; a run reports them
and goes on. Files are decoded on demand (``read``) or kept in memory when the pool is small enough.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf

from enhance.audio_io import AUDIO_SUFFIXES, fs_path, read_blocks, unreadable

log = logging.getLogger(__name__)


def content_fingerprint(
    paths: Iterable[str | Path], val: Iterable[np.ndarray] = (), sample: int = 4096
) -> str:
    """What ``--resume`` compares to know the data is the same: each file's name and size, its first and last
    ``sample`` bytes, in order, and the given arrays' samples (validation pairs in memory). Not the folders (a
    corpus moved to another machine is the same data), nor whole files (a DNS corpus is hundreds of GB)."""
    h = hashlib.sha256()
    for path in map(Path, paths):
        size = path.stat().st_size
        h.update(f"{path.name}\0{size}\0".encode(errors="surrogateescape"))
        with open(path, "rb") as f:
            h.update(f.read(sample))
            if size > sample:
                f.seek(max(sample, size - sample))
                h.update(f.read(sample))
    for array in val:
        h.update(np.ascontiguousarray(array, dtype=np.float32).tobytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str


@dataclass
class AudioPool:
    paths: list[str]
    frames: list[int]  # length of each file in samples
    sample_rate: int
    skipped: list[Skipped] = field(default_factory=list)
    _cache: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def total_seconds(self) -> float:
        return float(sum(self.frames)) / self.sample_rate

    def __len__(self) -> int:
        return len(self.paths)

    def subset(self, paths: list[str]) -> AudioPool:
        """A pool of the given paths (which must be in this pool), in the given order."""
        where = {p: i for i, p in enumerate(self.paths)}
        return AudioPool(list(paths), [self.frames[where[p]] for p in paths], self.sample_rate)

    def read(self, index: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Mono float32 samples ``[start, stop)`` of file ``index`` (channels averaged)."""
        if index in self._cache:
            return self._cache[index][start:stop]
        data, _ = sf.read(fs_path(self.paths[index]), start=start, stop=stop, dtype="float32", always_2d=True)
        return data.mean(axis=1)

    def preload(self, max_bytes: int = 2 << 30) -> bool:
        """Decode every file into memory if the whole pool fits in ``max_bytes`` (float32)."""
        if sum(self.frames) * 4 > max_bytes:
            return False
        for i in range(len(self.paths)):
            if i not in self._cache:
                self._cache[i] = self.read(i)
        return True


def list_audio(roots: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Audio files below the given folders (recursively, through symlinked folders), in a stable sorted order.
    A folder that cannot be read and a link to a missing file are listed too, so that :func:`scan` reports them
    with the reason (they were left out without a word: "0 files skipped" with half a corpus unread)."""
    found: list[str] = []
    for root in roots:
        p = Path(root)
        if p.is_file():
            found.append(str(p))
            continue
        if not p.is_dir():
            raise FileNotFoundError(f"{p}: no such folder")
        seen: set[str] = set()
        closed: list[str] = []  # folders the walk could not list

        def note(err: OSError, into: list[str] = closed) -> None:
            into.append(err.filename if err.filename else str(err))

        for folder, dirs, files in os.walk(p, followlinks=True, onerror=note):  # corpora are often symlinks
            real = os.path.realpath(folder)
            if real in seen:  # a link back up the tree
                dirs.clear()
                continue
            seen.add(real)
            found.extend(
                os.path.join(folder, f)
                for f in files
                if Path(f).suffix.lower() in AUDIO_SUFFIXES
                and (os.path.isfile(os.path.join(folder, f)) or not os.path.exists(os.path.join(folder, f)))
            )
        found.extend(closed)
    return sorted(found)


SILENCE_PEAK = 1e-4  # a file (or a validation pair's clean side) no louder than this is digital silence


def scan(
    paths: Iterable[str],
    sample_rate: int = 16000,
    min_seconds: float = 0.5,
    silence_peak: float = SILENCE_PEAK,
    shown: Mapping[str, str] | None = None,
) -> AudioPool:
    """Check files and keep the usable ones; every other file is listed in ``pool.skipped`` with the reason.
    ``shown``: the name the log gives a path (VoiceBank's 16-kHz cache copies are logged as the corpus' files)."""
    pool = AudioPool([], [], sample_rate)
    min_frames = int(min_seconds * sample_rate)
    paths = list(paths)
    # a file named twice (through a link, or by overlapping folders) was trained on twice, and could be held out
    # for validation while its twin trained: it is used once, by its own name where that is listed (the name
    # sorted first kept the link and called the file itself the duplicate), else by the first name
    keeper: dict[str, str] = {}  # real path -> the path that uses it
    for path in paths:
        real = os.path.realpath(path)
        if real not in keeper or (os.path.abspath(path) == real != os.path.abspath(keeper[real])):
            keeper[real] = path
    used: set[str] = set()  # real paths taken already (overlapping folders list the same path twice)
    for path in paths:
        real = os.path.realpath(path)
        if os.path.exists(path) and (keeper[real] != path or real in used):
            how = (
                "listed twice" if os.path.abspath(path) == os.path.abspath(keeper[real]) else "through a link"
            )
            reason: str | None = f"the same file as {keeper[real]} ({how}): used once"
        else:
            used.add(real)
            reason = _problem(path, sample_rate, min_frames, silence_peak)
        if reason is None:
            pool.paths.append(path)
            pool.frames.append(sf.info(fs_path(path)).frames)
        else:
            pool.skipped.append(Skipped(path, reason))
            log.warning("skipping %s: %s", (shown or {}).get(path, path), reason)
    return pool


def _without_path(message: str, path: str) -> str:
    """libsndfile's first line without the path it repeats ("Error opening '/long/path/x.wav': File contains
    data in an unknown format."): cut to 120 characters with the path in it, the reason itself was lost."""
    line = message.splitlines()[0] if message else ""
    for shown in (f"'{fs_path(path)}'", f"'{path}'", fs_path(path), path):
        line = line.replace(shown, "")
    return " ".join(line.split()).replace(" :", ":")[:200]


def _problem(path: str, sample_rate: int, min_frames: int, silence_peak: float) -> str | None:
    if os.path.isdir(path):  # listed by list_audio because it could not be read
        return "a folder that cannot be read (permission denied): its files are left out"
    if not os.path.exists(path):
        return "a link to a missing file" if os.path.islink(path) else "no such file"
    reason = unreadable(path)
    if reason:
        return reason
    try:
        info = sf.info(fs_path(path))
    except Exception as exc:  # libsndfile raises several types on foreign or truncated files
        return f"unreadable ({_without_path(str(exc), path) or type(exc).__name__})"
    if info.samplerate != sample_rate:
        return f"sample rate {info.samplerate} Hz, expected {sample_rate} Hz (resample the corpus first)"
    if info.frames < min_frames:
        return f"too short ({info.frames / sample_rate:.2f} s < {min_frames / sample_rate:.2f} s)"
    try:
        peak, decoded = 0.0, 0
        with sf.SoundFile(fs_path(path)) as f:
            for block in read_blocks(f, 1 << 16):
                if not np.isfinite(block).all():
                    return "contains NaN or infinite samples"
                peak = max(peak, float(np.abs(block).max(initial=0.0)))
                decoded += len(block)
        if decoded < info.frames:
            return f"truncated (decodes {decoded} of the {info.frames} frames its header gives)"
    except Exception as exc:
        return f"corrupt data ({str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__})"
    if peak < silence_peak:
        return f"silent (peak {peak:.1e})"
    return None
