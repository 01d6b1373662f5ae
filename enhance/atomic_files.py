"""Files written whole or not at all: a temporary file beside the target, renamed onto it on success (checkpoints,
enhanced audio, tables, run state). Standard library only, so that :mod:`models` can save checkpoints with it
without loading the audio stack."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], replace: bool = True, durable: bool = False) -> Iterator[str]:
    """Yield a temporary path beside ``path``; on success it is renamed onto ``path``, on failure removed.

    Readers never see a half-written file, and an existing file is untouched when writing fails. ``replace``
    False: never replace a file that appeared at ``path`` meanwhile (another process writing the same output
    after both checked it was free): ``FileExistsError`` instead, and that file stays as it was. ``durable``:
    the data reaches the disk before the rename, and the rename before returning (``fsync``), so that a power cut
    leaves the old file or the new one, never an empty one (checkpoints, a run's state).

    A file that is replaced keeps its permissions (a private 0600 recording stayed private only until
    ``--overwrite``), and a symbolic link to a file is written through: the file it points to is replaced, the
    link stays (as sox and ffmpeg write through it).
    """
    target = Path(path)
    if replace and target.is_symlink() and target.exists():
        target = Path(os.path.realpath(target))
    try:
        mode = stat.S_IMODE(target.stat().st_mode) if replace and target.is_file() else None
    except OSError:
        mode = None
    made = [d for d in (target.parent, *target.parent.parents) if not d.exists()]  # deepest first
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:  # named the temporary file ("[Errno 30] Read-only file system: '.x.wav.1a2b.tmp'")
        raise OSError(exc.errno, f"cannot create {target.name} in {target.parent}: {exc.strerror}") from None
    os.close(fd)
    try:
        yield tmp
        # mkstemp makes 0600 (and some writers replace the file): give it the permissions open() would, or the
        # replaced file's own
        os.chmod(tmp, 0o666 & ~_umask() if mode is None else mode)
        if durable:
            _fsync(tmp)
        if replace:
            os.replace(tmp, target)
        else:
            _move_to_new(tmp, target)
        if durable:
            _fsync(target.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        for d in made:  # the folders made for it, if still empty (another writer may have filled one)
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


def nearest_existing(path: str | os.PathLike[str]) -> Path | None:
    """``path`` or, if it does not exist, the nearest of its parents that does (None: not even the root)."""
    return next((p for p in (Path(path), *Path(path).parents) if p.exists()), None)


def _fsync(path: str | os.PathLike[str]) -> None:
    """Flush a file's (or a folder's entries') data to the disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # a folder on Windows
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _move_to_new(tmp: str, target: Path) -> None:
    """``tmp`` becomes ``target`` only if there is no ``target``: a hard link fails atomically when the name is
    taken (a rename would replace it). Where the file system has no hard links, checked just before renaming."""
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, "written meanwhile by another process", str(target)) from None
    except OSError:  # no hard links here (some FUSE and FAT file systems)
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, "written meanwhile by another process", str(target)) from None
        os.replace(tmp, target)
        return
    os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
