"""Find paired (noisy, clean) test files in the folder layouts of the common test sets.

Supported layouts (detected by :func:`find_pairs` in this order):

* ``dns``: DNS Challenge synthetic test set, ``<root>/test_set/synthetic/no_reverb/{noisy,clean}`` (``<root>`` may
  also be ``test_set``, ``synthetic`` or ``no_reverb`` itself). Noisy files are named ``..._fileid_12.wav`` and
  clean ones ``clean_fileid_12.wav``: they are paired by the ``fileid_N`` token.
* ``voicebank``: VoiceBank-DEMAND, ``<root>/noisy_testset_wav`` + ``<root>/clean_testset_wav``, paired by name.
* ``dev``: the shared dev set, ``<root>/dev/{noisy,clean}`` or ``<root>/{noisy,clean}``, paired by identical file
  name. A ``{noisy,clean}`` pair of folders whose names do not match but carry ``fileid_N`` tokens is read as the
  DNS layout.

Files whose partner is missing are not fatal: they are listed in the result's ``warnings``. Hidden files (such as
the temporary files of an interrupted atomic write) and non-audio files are ignored.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from enhance.audio_io import AUDIO_SUFFIXES

_FILEID = re.compile(r"fileid_(\d+)")
# the DNS-Challenge repository (what tim-train --root takes), its datasets/ folder, the test set and below
_DNS_SUBDIRS = (
    "datasets/test_set/synthetic/no_reverb",
    "test_set/synthetic/no_reverb",
    "synthetic/no_reverb",
    "no_reverb",
)


LENGTH_TOLERANCE = 0.05  # noisy and clean sides of a pair may differ by this fraction (and 0.1 s) in length


def length_problem(n_noisy: int, n_clean: int, rate: int = 16000) -> str | None:
    """Why a pair's two sides look mis-paired (None: they do not): lengths that differ by more than 5 % and more
    than 0.1 s. Pairs are scored on their common start, so such a pair was cut silently."""
    longer, shorter = max(n_noisy, n_clean), min(n_noisy, n_clean)
    if longer - shorter <= max(LENGTH_TOLERANCE * longer, 0.1 * rate):
        return None
    return (
        f"noisy {n_noisy / rate:.2f} s and clean {n_clean / rate:.2f} s: lengths differ by more than "
        f"{LENGTH_TOLERANCE:.0%} (mis-paired files?)"
    )


@dataclass(frozen=True)
class Pair:
    """One test item: a noisy file and its clean reference, under a unique display name."""

    name: str
    noisy_path: Path
    clean_path: Path


@dataclass
class Discovery:
    """What :func:`discover_pairs` found: the layout, the pairs (sorted by name) and non-fatal warnings."""

    layout: str
    root: Path
    pairs: list[Pair]
    warnings: list[str] = field(default_factory=list)


def natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders ``fileid_2`` before ``fileid_10``."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", text) if p)


def audio_files(folder: Path) -> list[Path]:
    """The audio files directly inside ``folder`` (not recursive), hidden files excluded."""
    return sorted(
        (p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and _is_audio(p)),
        key=lambda p: natural_key(p.name),
    )


def _is_audio(path: Path) -> bool:
    return path.suffix.lower() in AUDIO_SUFFIXES


def name_key(path: Path) -> str | None:
    """Pairing key of the dev and VoiceBank layouts: the file name itself."""
    return path.name


def fileid_key(path: Path) -> str | None:
    """Pairing key of the DNS layout: the last ``fileid_N`` token of the file stem (``fileid_12``), or None."""
    found = _FILEID.findall(path.stem)
    return f"fileid_{int(found[-1])}" if found else None


def _index(
    files: list[Path], key: Callable[[Path], str | None], role: str, warnings: list[str]
) -> dict[str, Path]:
    """Map key -> file; files without a key or with a duplicate key become warnings."""
    out: dict[str, Path] = {}
    for path in files:
        k = key(path)
        if k is None:
            warnings.append(f"{role} file {path.name}: no pairing key in its name, ignored")
        elif k in out:
            warnings.append(f"{role} file {path.name}: same key '{k}' as {out[k].name}, ignored")
        else:
            out[k] = path
    return out


def pair_folders(
    noisy_dir: Path, clean_dir: Path, key: Callable[[Path], str | None], layout: str, root: Path
) -> Discovery:
    """Pair the audio files of two folders by ``key``; unpaired files become warnings.

    Raises ValueError when nothing pairs up.
    """
    warnings: list[str] = []
    noisy = _index(audio_files(noisy_dir), key, "noisy", warnings)
    clean = _index(audio_files(clean_dir), key, "clean", warnings)
    common = sorted(set(noisy) & set(clean), key=natural_key)
    for k in sorted(set(noisy) - set(clean), key=natural_key):
        warnings.append(f"noisy file {noisy[k].name}: no clean file matches it in {clean_dir}")
    for k in sorted(set(clean) - set(noisy), key=natural_key):
        warnings.append(f"clean file {clean[k].name}: no noisy file matches it in {noisy_dir}")
    if not common:
        raise ValueError(
            f"{root}: found the {layout} layout ({noisy_dir} and {clean_dir}) but no noisy file pairs with a "
            f"clean file ({len(noisy)} noisy, {len(clean)} clean audio files)"
        )
    names = [_display_name(k, noisy[k]) for k in common]
    clash = {n for n in names if names.count(n) > 1}  # x.wav and x.flac: per-file tables are keyed by name
    pairs = [
        Pair(noisy[k].name if n in clash else n, noisy[k], clean[k])
        for k, n in zip(common, names, strict=True)
    ]
    return Discovery(layout, root, pairs, warnings)


def _display_name(key: str, noisy: Path) -> str:
    """``fileid_12`` for DNS keys, the file stem otherwise (the file name where two stems are the same)."""
    return key if _FILEID.fullmatch(key) else noisy.stem


def _has_dirs(folder: Path, *names: str) -> bool:
    return all((folder / n).is_dir() for n in names)


def dns_pairs(root: str | os.PathLike[str]) -> Discovery:
    """Pairs of the DNS Challenge synthetic no-reverb test set (see module docstring); ValueError if absent."""
    base = Path(root)
    for sub in (*_DNS_SUBDIRS, "."):
        folder = base / sub
        if _has_dirs(folder, "noisy", "clean"):
            return pair_folders(folder / "noisy", folder / "clean", fileid_key, "dns", base)
    raise ValueError(f"{base}: no test_set/synthetic/no_reverb/{{noisy,clean}} folders (DNS layout)")


def voicebank_pairs(root: str | os.PathLike[str]) -> Discovery:
    """Pairs of the VoiceBank-DEMAND test set; ValueError if its folders are absent."""
    base = Path(root)
    if not _has_dirs(base, "noisy_testset_wav", "clean_testset_wav"):
        raise ValueError(
            f"{base}: no noisy_testset_wav and clean_testset_wav folders (VoiceBank-DEMAND layout)"
        )
    return pair_folders(base / "noisy_testset_wav", base / "clean_testset_wav", name_key, "voicebank", base)


def dev_pairs(root: str | os.PathLike[str]) -> Discovery:
    """Pairs of the shared dev layout (``dev/{noisy,clean}`` or ``{noisy,clean}``); ValueError if absent."""
    base = Path(root)
    for sub in ("dev", "."):
        folder = base / sub
        if _has_dirs(folder, "noisy", "clean"):
            return pair_folders(folder / "noisy", folder / "clean", name_key, "dev", base)
    raise ValueError(f"{base}: no dev/{{noisy,clean}} or {{noisy,clean}} folders (dev layout)")


def _names_overlap(folder: Path) -> bool:
    """Whether any audio file name appears in both ``noisy`` and ``clean`` of ``folder``."""
    noisy = {p.name for p in audio_files(folder / "noisy")}
    return any(p.name in noisy for p in audio_files(folder / "clean"))


def discover_pairs(root: str | os.PathLike[str]) -> Discovery:
    """Detect the layout under ``root`` and pair its files.

    Raises ValueError with the layouts that were looked for when none applies, or when one applies but no file
    pairs up.
    """
    base = Path(root)
    if not base.is_dir():
        raise ValueError(f"{base}: {'not a folder' if base.exists() else 'no such folder'}")
    if any(_has_dirs(base / sub, "noisy", "clean") for sub in _DNS_SUBDIRS):
        return dns_pairs(base)
    if _has_dirs(base, "noisy_testset_wav", "clean_testset_wav"):
        return voicebank_pairs(base)
    for sub in ("dev", "."):
        folder = base / sub
        if _has_dirs(folder, "noisy", "clean"):
            if not _names_overlap(folder) and any(fileid_key(p) for p in audio_files(folder / "noisy")):
                return pair_folders(folder / "noisy", folder / "clean", fileid_key, "dns", base)
            return pair_folders(folder / "noisy", folder / "clean", name_key, "dev", base)
    raise ValueError(
        f"{base}: no known test-set layout; expected one of: dev/{{noisy,clean}} or {{noisy,clean}} (dev set), "
        "[datasets/]test_set/synthetic/no_reverb/{noisy,clean} (DNS Challenge), noisy_testset_wav + clean_testset_wav "
        "(VoiceBank-DEMAND)"
    )


def find_pairs(root: str | os.PathLike[str], warnings: list[str] | None = None) -> list[Pair]:
    """The (noisy, clean) pairs under ``root``; non-fatal problems are appended to ``warnings`` if given.

    See :func:`discover_pairs` for the errors.
    """
    found = discover_pairs(root)
    if warnings is not None:
        warnings.extend(found.warnings)
    return found.pairs
