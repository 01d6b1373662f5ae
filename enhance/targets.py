"""What a command line's inputs are and where each one's output goes: files, folders (scanned, links followed
once), globs and pipes expanded; output names beside the inputs or under an output folder; the checks made
before any model loads (two inputs writing one output, an output that would replace an input, a container that
cannot be written)."""

from __future__ import annotations

import glob
import os
import stat
import sys
from pathlib import Path

import soundfile as sf

from enhance.audio_io import AUDIO_SUFFIXES, AudioError, fs_path, output_format


def expand_inputs(
    items: list[str], output: str | None = None
) -> tuple[list[tuple[str, str | None]], int, bool]:
    """(path, relative name under its folder or None) for every input ('-' stays '-'); how many files of the
    folders and globs given were left out as earlier outputs: those under the output folder (``-o`` inside an
    input folder) and, when outputs go beside their inputs (no ``-o``), the ``*.enhanced.*`` files; and whether
    any item was a folder or a glob (then ``-o`` is a folder, even for one file found)."""
    out: list[tuple[str, str | None]] = []
    left_out = 0
    collective = False
    out_dir = Path(output).resolve() if output not in (None, "-") else None
    for item in items:
        if item == "-":
            out.append(("-", None))
        elif os.path.isdir(item):
            collective = True
            root = Path(item)
            if out_dir is not None and root.resolve() == out_dir:  # every file would be "an earlier output"
                raise AudioError(
                    f"-o {output} is the input folder {item}: the outputs would replace the inputs; "
                    "choose another folder (or leave out -o: outputs go beside the inputs as *.enhanced.*)"
                )
            files = _scan(root, out_dir)
            kept = [f for f in files if not _earlier_output(f, root, out_dir, output is None)]
            left_out += len(files) - len(kept)
            out.extend((str(f), str(f.relative_to(root))) for f in kept)
        elif is_glob(item):
            collective = True
            files = [Path(f) for f in sorted(glob.glob(item, recursive=True)) if os.path.isfile(f)]
            base = _glob_base(item)
            kept = [f for f in files if not _earlier_output(f, base, out_dir, output is None)]
            left_out += len(files) - len(kept)
            out.extend((str(f), None) for f in kept)
        else:
            out.append((item, None))  # a missing file is reported when it is processed
    return out, left_out, collective


def _scan(root: Path, out_dir: Path | None = None) -> list[Path]:
    """The audio files under ``root``, sorted; hidden folders are not entered. A link to a folder is followed
    unless that folder was walked already (a link to a folder above is no loop) or is the output folder
    ``out_dir`` or in it (earlier outputs are no inputs); a file reached both ways keeps its own name. A link
    whose target is gone is kept, to fail with its reason. rglob entered no linked folder and dropped a dangling
    link, both without a word."""
    found: list[Path] = []
    seen: set[str] = set()  # the real paths of the folders walked, or about to be through a link
    for folder, dirs, names in os.walk(root, followlinks=True):
        seen.add(os.path.realpath(folder))
        kept = []
        for d in sorted(dirs):
            path = os.path.join(folder, d)
            if d.startswith("."):
                continue
            if os.path.islink(path):
                real = os.path.realpath(path)
                inside_out = out_dir is not None and (Path(real) == out_dir or out_dir in Path(real).parents)
                if real in seen or inside_out:
                    continue
                seen.add(real)
            kept.append(d)
        dirs[:] = kept
        for name in names:
            f = Path(folder) / name
            dangling = f.is_symlink() and not f.exists()
            if f.suffix.lower() in AUDIO_SUFFIXES and not name.startswith(".") and (f.is_file() or dangling):
                found.append(f)
    # a file reached by two ways (a link to a folder inside a linked one) once, by the name with the fewest links
    best: dict[str, Path] = {}
    for f in sorted(found, key=lambda f: (_links_to(f, root), str(f))):
        best.setdefault(str(f) if f.is_symlink() and not f.exists() else os.path.realpath(f), f)
    return sorted(best.values())


def _links_to(f: Path, root: Path) -> int:
    """Through how many links to folders below ``root`` the path ``f`` goes."""
    return sum((root / parent).is_symlink() for parent in f.relative_to(root).parents if parent != Path("."))


def is_glob(item: str) -> bool:
    """A pattern for enhance-cli to expand (not a file that happens to have '*' in its name)."""
    return any(ch in item for ch in "*?[") and not os.path.exists(item)


def _glob_base(pattern: str) -> Path:
    """The folder a glob searches: its leading components without wildcards ('rec/raw/*.wav': rec/raw)."""
    parts = Path(pattern).parts
    fixed = next((i for i, part in enumerate(parts) if any(ch in part for ch in "*?[")), len(parts))
    return Path(*parts[:fixed]) if fixed else Path(".")


def _earlier_output(f: Path, base: Path, out_dir: Path | None, beside: bool) -> bool:
    """Whether ``f``, found under the folder ``base`` that an input folder or glob searches, is an output of an
    earlier run: with ``-o``, a file in the output folder when that folder is ``base`` or inside it (an output
    folder above or beside the inputs, ``rec/raw -o rec``, holds inputs: they were dropped); without, beside the
    inputs, a ``*.enhanced.*`` file."""
    if beside:
        return f.stem.endswith(".enhanced")
    if out_dir is None:
        return False
    root = base.resolve()
    return (out_dir == root or root in out_dir.parents) and out_dir in f.resolve().parents


def clashes(targets: list[tuple[str, str]]) -> str | None:
    """The first output path that two inputs would both write ((input, output) pairs; '-' ignored), as a
    message, or None."""
    seen: dict[str, str] = {}
    for src, dst in targets:
        if dst == "-":
            continue
        key = os.path.normcase(os.path.abspath(dst))
        if key in seen:
            return f"{seen[key]} and {src} would both be written to {dst} (give them distinct names)"
        seen[key] = src
    return None


def derived_suffix(src: str, fmt: str | None) -> str:
    """The extension of an output named after its input: the input's, unless ``--format`` asks for another
    container (FLAC data in a file named .wav fooled players) or the input's names no container libsndfile
    writes (no extension: then the input's own container, where it can be read)."""
    suffix = Path(src).suffix
    try:
        named: tuple[str, str | None] | None = output_format(f"x{suffix}")
    except AudioError:
        named = None
    if fmt is None:
        if named is not None:
            return suffix
        if is_special(src):  # a pipe's header read here would be gone for the enhancement: WAV, as from stdin
            return ".wav"
        try:
            fmt = sf.info(fs_path(src)).format
        except Exception:
            return suffix  # unreadable: enhancing it reports why
    fmt = fmt.upper()
    if named == (fmt, None):
        return suffix
    return CONTAINER_SUFFIXES.get(fmt, f".{fmt.lower()}")


# the extensions of the containers whose names are not theirs (a .wavex no player knew, and folder scans skipped)
CONTAINER_SUFFIXES = {"WAVEX": ".wav", "MAT4": ".mat", "MAT5": ".mat"}


def output_for(src: str, rel: str | None, output: str | None, as_dir: bool, fmt: str | None = None) -> str:
    """Where ``src`` is written: ``-o`` itself, or a name made from the input's (beside it, or under the ``-o``
    folder, which it is when it ends with '/', exists as a folder, or ``as_dir``: several inputs, a folder or a
    glob)."""
    if output == "-":
        return "-"
    if output is None:
        if src == "-":
            return "-"
        # /dev/fd/63.enhanced.wav is no place to write, nor /dev/stdin.enhanced.wav when stdin is a redirected file
        if special_output(src):
            raise AudioError(
                f"{src}: a pipe or device has no folder to write beside: give -o a file name (or -)"
            )
        p = Path(src)
        return str(p.with_name(f"{p.stem}.enhanced{derived_suffix(src, fmt)}"))
    if not (as_dir or output.endswith(("/", os.sep)) or os.path.isdir(output)):
        return output
    if src == "-":
        raise AudioError(f"{output}: stdin has no name to write under a folder: give -o a file name (or -)")
    name = Path(rel if rel is not None else Path(src).name)
    return str(Path(output) / name.with_suffix(derived_suffix(src, fmt)))


def unwritable(
    targets: list[tuple[str, str]], output: str | None, fmt: str | None, subtype: str | None
) -> str | None:
    """Why an output could never be written, before the model loads (it was one failure per file, exit 1): a
    name given with -o whose extension names no container libsndfile writes, or --subtype with a container
    that cannot hold it. (An output named after an unreadable input is left to that file's own error.)"""
    for _, dst in targets:
        if dst == "-" or special_output(dst):
            continue
        try:
            container = fmt.upper() if fmt else output_format(dst)[0]
        except AudioError as exc:
            if dst == output:
                return str(exc)
            continue
        if subtype and not sf.check_format(container, subtype.upper()):
            return f"--subtype {subtype}: {container} files cannot hold it"
        if container == "RAW" and not subtype:
            return f"{dst}: RAW output has no header: name its sample format with --subtype (e.g. PCM_16)"
    return None


def is_special(src: str) -> bool:
    """An input that exists but is neither a regular file nor a folder: a named pipe, /dev/stdin, <(...)."""
    return os.path.exists(src) and not os.path.isfile(src) and not os.path.isdir(src)


def special_output(dst: str) -> bool:
    """An output written in place, not through a temporary file renamed over it (which would replace the name
    itself): a pipe or device, or a name reached through /dev or /proc, such as /dev/stdout, which leads to the
    regular file a shell redirected stdout to, and which a rename replaced while that file stayed empty."""
    if is_special(dst):
        return True
    path = os.path.abspath(dst)
    for _ in range(40):  # the links' chain, as the kernel follows it (at most 40)
        if path.startswith(("/dev/", "/proc/")):
            return True
        if not os.path.islink(path):
            return False
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
    return False


def is_stdout(path: str | None) -> bool:
    """Whether an output is this process' stdout: '-', or another name for it (/dev/stdout, /proc/self/fd/1, a
    link to them), compared by device and inode with descriptor 1: audio there leaves no room for other text."""
    if path is None:
        return False
    if path == "-":
        return True
    try:
        st, out = os.stat(path), os.fstat(1)
    except (OSError, ValueError):
        return False
    return (st.st_dev, st.st_ino) == (out.st_dev, out.st_ino)


def file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def inputs_overwritten(targets: list[tuple[str, str]], ids: dict[tuple[int, int] | None, str]) -> str | None:
    """Why the outputs would overwrite another input (None: they do not): ``a.wav a.enhanced.wav
    --overwrite`` replaced the second input with the first one's result, and ``- -o in.wav < in.wav`` its own
    (stdin redirected from the output file), and an output that is its own input (``a.wav -o a.wav``; also
    refused per file by enhance_file, for callers of the API). ``ids``: :func:`input_ids` of ``targets``."""
    names = {os.path.realpath(src): src for src, _ in targets if src != "-"}
    for src, dst in targets:
        if dst == "-":
            continue
        if os.path.isfile(dst):
            other = ids.get(file_id(dst))
            if other == "-":
                return f"{dst}: stdin is read from this file, and the output would replace it"
            if other is not None:
                if file_id(other) == file_id(src):
                    return f"{dst}: refusing to overwrite the input file {src} (write the output elsewhere)"
                return f"{dst}: the output of {src} would overwrite another input ({other})"
        else:  # not there yet: written first, it would then be read as that input
            other = names.get(os.path.realpath(dst))
            if other is not None and os.path.realpath(other) != os.path.realpath(src):
                return f"{dst}: the output of {src} is also given as an input ({other})"
    return None


def input_ids(targets: list[tuple[str, str]]) -> dict[tuple[int, int] | None, str]:
    """(device, inode) of every input file, and of the file stdin was redirected from ("-"), to its name."""
    ids = {file_id(src): src for src, _ in targets if src != "-" and os.path.isfile(src)}
    stdin = stdin_file_id() if any(src == "-" for src, _ in targets) else None
    if stdin is not None:
        ids[stdin] = "-"
    ids.pop(None, None)  # an input that vanished: no id to compare with
    return ids


def stdin_file_id() -> tuple[int, int] | None:
    """(device, inode) of the regular file stdin was redirected from (None: a pipe, a terminal, closed)."""
    try:
        st = os.fstat(sys.stdin.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


def map_target(option: str | None, src: str, rel: str | None, many: bool) -> str:
    """Where ``--competition-map`` puts the map of ``src`` ("" without the option)."""
    if option is None:
        return ""
    if many or option.endswith("/") or os.path.isdir(option):
        return str(Path(option) / f"{Path(rel or Path(src).name).with_suffix('')}.competition.png")
    return option
