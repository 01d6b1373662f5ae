"""enhance-cli: denoise speech recordings with a TIM model.

Examples:
  enhance-cli noisy.wav -o clean.wav                 one file (any format libsndfile reads, any rate, 1-64 channels)
  enhance-cli a.flac b.mp3 -o out/                   several files into a folder (same names)
  enhance-cli recordings/ -o cleaned/                a folder, recursively; sub-folders are mirrored
  enhance-cli 'takes/*.wav' -o cleaned/              a glob (quoted: expanded by enhance-cli)
  enhance-cli noisy.wav                              writes noisy.enhanced.wav beside the input
  enhance-cli - -o - < noisy.wav > clean.wav         stdin to stdout (WAV out unless --format)
  enhance-cli noisy.wav -o clean.wav --competition-map maps.png   also draw the TIM competition maps
  enhance-cli noisy.wav -o clean.wav --checkpoint runs/x/best.safetensors --json
  enhance-cli --stream noisy.wav -o clean.wav        the real-time engine on a file (output aligned with input)
  arecord -f S16_LE -r 16000 -t raw | enhance-cli --stream - -o - | aplay -f S16_LE -r 16000 -t raw

Exit status: 0 when every file was enhanced, 1 when any file failed (the others are still processed),
2 for usage errors (bad flags, unknown model).
"""

from __future__ import annotations

import enhance.wait_policy  # noqa: F401  (first: OpenMP reads its waiting policy when torch loads it)

# isort: split
import argparse
import functools
import glob
import json
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

import soundfile as sf
import torch

from enhance.arguments import number, package_version
from enhance.audio_io import (
    AUDIO_SUFFIXES,
    MAX_CHANNELS,
    MAX_STREAM_RATE,
    MIN_RATE,
    AudioError,
    fs_path,
    missing,
    nearest_existing,
    output_format,
    read_piped,
    refused_container,
)
from enhance.backends import BACKENDS, REDUCED_PRECISION, streaming_backend
from enhance.device import inference_device
from enhance.files import FileResult, enhance_bytes, enhance_file, new_output
from enhance.pipe import stream_pcm
from models.checkpoint import Checkpoint, CheckpointError, load_checkpoint, read_metadata
from models.pretrained import DEFAULT_MODEL, load_pretrained, pretrained_path


def attenuation_db(text: str) -> float:
    """``--max-attenuation-db`` (enhance-cli, recipes.evaluate): a number of dB >= 0, or inf (checked as
    :meth:`models.Enhancer.set_max_attenuation` will check it)."""
    value = number(text, float)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be at least 0 dB (or inf for no limit), got {text}")
    return value


def bundled_limit_text() -> str:
    """The bundled default's attenuation limit for ``--help``, read from its checkpoint's metadata (no weights)."""
    try:
        limit = read_metadata(pretrained_path()).get("config", {}).get("max_attenuation_db")
    except CheckpointError:
        return ""
    return f", {limit:g} dB for the bundled '{DEFAULT_MODEL}'" if limit is not None else ""


MAX_CHUNK_SECONDS = 3600.0


def _seconds(text: str) -> float:
    """``--chunk-seconds``: a positive number of seconds, at most an hour (1e306 overflowed the block size)."""
    value = number(text, float)
    if not 0 < value <= MAX_CHUNK_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds above 0 and at most {MAX_CHUNK_SECONDS:g}, got {text}"
        )
    return value


def _ranged(lo: int, hi: int) -> Any:
    def check(text: str) -> int:
        value = number(text, int)
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be from {lo} to {hi}, got {text}")
        return value

    return check


class CliParser(argparse.ArgumentParser):
    """argparse, with a hint for a file whose name starts with a dash: ``enhance-cli -take1.wav -o x.wav`` said
    only "the following arguments are required: inputs". Given for argparse's own errors only, and for the
    arguments before a ``--`` (after it, the name was already read as a file)."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        given = list(sys.argv[1:] if args is None else args)
        self.options = given[: given.index("--")] if "--" in given else given
        try:
            return super().parse_args(given, namespace)
        finally:
            self.options = []

    def error(self, message: str) -> NoReturn:
        dashed = [
            a for a in getattr(self, "options", []) if a.startswith("-") and a != "-" and os.path.isfile(a)
        ]
        if dashed:
            message += f" ({dashed[0]} is a file: write ./{dashed[0]}, or put -- before the inputs)"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    p = CliParser(
        prog="enhance-cli",
        description=__doc__.split("\n", 1)[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("inputs", nargs="+", help="audio files, folders or globs; '-' reads stdin")
    p.add_argument(
        "-o",
        "--output",
        help="output file, or folder (ends with '/', exists, or several inputs); '-' = stdout",
    )
    m = p.add_mutually_exclusive_group()
    m.add_argument("--model", default=DEFAULT_MODEL, help="bundled model name (default: %(default)s)")
    m.add_argument("--checkpoint", help="a .safetensors checkpoint made by the training recipes")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="replace existing outputs (never the input)")
    p.add_argument(
        "--format",
        help="output container, e.g. WAV, FLAC, OGG, OPUS (Opus in Ogg) (default: the input's / the extension's)",
    )
    p.add_argument(
        "--subtype", help="output sample format, e.g. PCM_16, PCM_24, FLOAT (default: the input's)"
    )
    p.add_argument(
        "--competition-map", metavar="FILE", help="write the competition maps: .png (drawn) or .npz (data)"
    )
    p.add_argument(
        "--chunk-seconds",
        type=_seconds,
        default=10.0,
        help="audio per model pass: memory vs. speed, same result at any size (default %(default)s)",
    )
    p.add_argument("--threads", type=int, help="CPU threads for the model (default: PyTorch's choice)")
    p.add_argument(
        "--max-attenuation-db",
        type=attenuation_db,
        metavar="DB",
        help="never attenuate a bin more than DB dB below the input (a floor on cuts, not a bypass: at 0 the model "
        f"can still raise bins; default: the model's own setting{bundled_limit_text()}; 'inf' = no limit)",
    )
    p.add_argument(
        "--high-band",
        choices=["gate", "drop"],
        default="gate",
        help="inputs above 16 kHz: the model works below 8 kHz; 'gate' (the default) keeps the input's band above "
        "8 kHz, attenuated every 4 ms as much as the model attenuated 6-8 kHz; 'drop' leaves it out (the output is "
        "the 16 kHz model's band only)",
    )
    s = p.add_argument_group("real-time streaming")
    s.add_argument(
        "--stream",
        action="store_true",
        help="use the real-time engine (16 ms steps); '- -o -' becomes a raw PCM pipe (output lags by <= 48 ms at "
        "16 kHz; at other --rate values soxr's resamplers hold back more, e.g. about 80 ms on average at 48 kHz and "
        "170 at 8 kHz, less with --resampling low_latency; README, 'Real-time streaming')",
    )
    s.add_argument(
        "--stream-backend",
        choices=BACKENDS,
        help="what runs the model's 16 ms steps (with --stream): auto (the default) = native, the step in C, where "
        "a C compiler is (compiled once, cached; 3-4x faster than torchscript per 16 ms hop in our benchmark), else torchscript on "
        "a CPU, else pytorch; onnxruntime needs the 'onnx' extra. Same samples (to float32 rounding: a 16-bit output "
        "may differ by one step), but for "
        f"{REDUCED_PRECISION} (medians over the dev pairs)",
    )
    s.add_argument("--pcm", choices=["s16le", "f32le"], help="raw pipe sample format (default s16le)")
    s.add_argument(
        "--rate",
        type=_ranged(MIN_RATE, MAX_STREAM_RATE),
        help=f"raw pipe sample rate, {MIN_RATE}-{MAX_STREAM_RATE} Hz (default 16000)",
    )
    s.add_argument(
        "--channels", type=_ranged(1, MAX_CHANNELS), help=f"raw pipe channels, 1-{MAX_CHANNELS} (default 1)"
    )
    s.add_argument(
        "--resampling",
        choices=["high", "low_latency"],
        help="raw pipe at a --rate other than 16000: soxr's HQ resamplers (high, the default: the offline "
        "path's samples) or its LQ ones (low_latency), which hold back less audio (8 kHz: 92 ms on average "
        "instead of 167)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print a machine-readable summary on stdout (on stderr, alone, when the audio goes to stdout)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar, no per-file lines")
    p.add_argument("--version", action="version", version=f"enhance-cli {package_version()}")
    return p


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
    when that folder is not part of the tree already (its files keep their own names; a link to a folder above
    is no loop), not already reached by another link, and not the output folder ``out_dir`` or in it (earlier
    outputs are no inputs). A link whose target is gone is kept, to fail with its reason. rglob entered no
    linked folder and dropped a dangling link, both without a word."""
    own = set()  # the real paths of the tree's own folders
    for folder, dirs, _ in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        own.add(os.path.realpath(folder))
    found: list[Path] = []
    seen = set(own)
    for folder, dirs, names in os.walk(root, followlinks=True):
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


def _hidden(relative: Path) -> bool:
    """A file a folder scan leaves out, as a glob does: under a name starting with '.' (macOS's "._take.wav"
    AppleDouble companions, which are not audio, a .git or .Trash folder)."""
    return any(part.startswith(".") for part in relative.parts)


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
        if _special(src):  # a pipe's header read here would be gone for the enhancement: WAV, as from stdin
            return ".wav"
        try:
            fmt = sf.info(fs_path(src)).format
        except Exception:
            return suffix  # unreadable: enhancing it reports why
    fmt = fmt.upper()
    if named == (fmt, None):
        return suffix
    return f".{fmt.lower()}"


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
        if _special_output(src):
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
        if dst == "-" or _special_output(dst):
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


def load_model(args: argparse.Namespace) -> Checkpoint:
    if args.checkpoint:
        ck = load_checkpoint(args.checkpoint, map_location="cpu")
        ck.model.to(args.device)
    else:
        ck = load_pretrained(args.model, args.device)
    if args.max_attenuation_db is not None:
        ck.model.set_max_attenuation(args.max_attenuation_db)
    return ck


class Progress:
    """A tqdm bar in input seconds on a terminal; nothing when piped or quiet."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.bar: Any = None

    def start(self, name: str, frames: int, rate: int) -> None:
        if self.enabled:
            from tqdm import tqdm

            self.rate, self.done = rate, 0
            self.bar = tqdm(total=round(frames / rate, 1), desc=Path(name).name[:30], unit="s", leave=False)

    def update(self, n: int) -> None:
        """``n`` more input frames done: the bar shows their sum, rounded (each block rounded on its own stood
        still for blocks under 50 ms, and over-counted those of 50-100 ms)."""
        if self.bar is not None:
            self.done += n
            self.bar.update(round(self.done / self.rate, 1) - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def run_one(
    ck: Checkpoint,
    src: str,
    dst: str,
    args: argparse.Namespace,
    progress: Progress,
    backend: Any = None,
    map_path: str = "",
) -> FileResult:
    """Enhance ``src`` into ``dst`` (and draw its competition maps into ``map_path`` when given)."""
    want_maps = bool(map_path)
    pipe_in = src != "-" and _special(src)  # a named pipe, /dev/stdin, <(...): read once, into memory
    # /dev/stdout, /dev/null, a named pipe: written in place (a temp file renamed over it would replace it)
    pipe_out = dst != "-" and _special_output(dst)
    if src != "-" and not pipe_in:  # (a pipe's header read here would be gone for the enhancement)
        try:
            info = sf.info(fs_path(src))
            progress.start(src, info.frames, info.samplerate)
        except Exception:
            pass  # enhance_file reports the problem
    try:
        if args.stream and src == "-":
            if dst != "-":
                raise AudioError(
                    "<stdin>: --stream reads raw PCM from stdin and writes it to stdout: use -o -"
                )
            t0 = time.perf_counter()
            n = stream_pcm(
                ck.model,
                sys.stdin.buffer,
                sys.stdout.buffer,
                rate=args.rate,
                channels=args.channels,
                pcm=args.pcm,
                backend=backend,
                high_band=args.high_band == "gate",
                low_latency=args.resampling == "low_latency",
            )
            return FileResult(
                "<stdin>",
                "-",
                True,
                sample_rate=args.rate,
                channels=args.channels,
                frames=n,
                wall_seconds=time.perf_counter() - t0,
            )
        stream_block = ck.config.stft.hop_length if args.stream else None
        if dst != "-" and src != "-" and not pipe_in and not pipe_out:
            result = enhance_file(
                ck.model,
                src,
                dst,
                overwrite=args.overwrite,
                out_format=args.format,
                out_subtype=args.subtype,
                block_seconds=args.chunk_seconds,
                stream_block=stream_block,
                with_competition=want_maps,
                on_progress=progress.update,
                backend=backend,
                high_band=args.high_band == "gate",
            )
            if want_maps:
                write_competition(map_path, result, ck, src)
            return result
        # a pipe on one side (stdin, stdout, a named pipe, /dev/stdin, <(...)): the encoded audio passes through
        # memory (a pipe cannot be read twice, nor has it a size)
        if src == "-":
            data = read_piped(sys.stdin.buffer, "<stdin>")
        elif pipe_in:
            with Path(src).open("rb") as stream:
                data = read_piped(stream, src)
        elif os.path.isfile(src):
            data = Path(src).read_bytes()
        else:
            raise AudioError(f"{src}: {missing(src)}")
        try:
            fmt, implied = (
                ((args.format or "WAV").upper(), None) if args.format or dst == "-" else output_format(dst)
            )
        except AudioError:
            if not pipe_out:
                raise
            fmt, implied = "WAV", None  # /dev/stdout names no format

        encoded, result = enhance_bytes(
            ck.model,
            data,
            name="<stdin>" if src == "-" else src,
            out_format=fmt,
            out_subtype=args.subtype or implied,
            block_seconds=args.chunk_seconds,
            stream_block=stream_block,
            with_competition=want_maps,
            on_progress=PendingStop.check,  # a stop signal lost in libsndfile's read callback: raised again
            backend=backend,
            high_band=args.high_band == "gate",
        )
        PendingStop.check()  # before anything is written
        if dst == "-":
            write_all(sys.stdout.buffer, encoded)
        elif pipe_out:
            with open(dst, "wb") as out:
                write_all(out, encoded)
        else:
            with new_output(dst, args.overwrite) as tmp:
                Path(tmp).write_bytes(encoded)
        result.output = dst
        if want_maps:  # a pipe's audio cannot be read again for the map's spectrogram: its bytes are passed
            write_competition(map_path, result, ck, data)
        return result
    finally:
        progress.close()


def _special(src: str) -> bool:
    """An input that exists but is neither a regular file nor a folder: a named pipe, /dev/stdin, <(...)."""
    return os.path.exists(src) and not os.path.isfile(src) and not os.path.isdir(src)


def _special_output(dst: str) -> bool:
    """An output written in place, not through a temporary file renamed over it (which would replace the name
    itself): a pipe or device, or a name reached through /dev or /proc, such as /dev/stdout, which leads to the
    regular file a shell redirected stdout to, and which a rename replaced while that file stayed empty."""
    if _special(dst):
        return True
    path = os.path.abspath(dst)
    for _ in range(40):  # the links' chain, as the kernel follows it (at most 40)
        if path.startswith(("/dev/", "/proc/")):
            return True
        if not os.path.islink(path):
            return False
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
    return False


def _is_stdout(path: str | None) -> bool:
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


def write_all(out: BinaryIO, data: bytes) -> None:
    """All of ``data`` to ``out``, or an error (a write can take part of it: a reader that went away then
    showed as a short output and exit 0)."""
    view = memoryview(data)
    while view:
        n = out.write(view)
        if not n:
            raise BrokenPipeError(32, "output closed before all of the audio was written")
        view = view[n:]
    out.flush()


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def inputs_overwritten(targets: list[tuple[str, str]], ids: dict[tuple[int, int] | None, str]) -> str | None:
    """Why the outputs would overwrite another input (None: they do not): ``a.wav a.enhanced.wav
    --overwrite`` replaced the second input with the first one's result, and ``- -o in.wav < in.wav`` its own
    (stdin redirected from the output file), and an output that is its own input (``a.wav -o a.wav``; also
    refused per file by enhance_file, for callers of the API). ``ids``: :func:`_input_ids` of ``targets``."""
    names = {os.path.realpath(src): src for src, _ in targets if src != "-"}
    for src, dst in targets:
        if dst == "-":
            continue
        if os.path.isfile(dst):
            other = ids.get(_file_id(dst))
            if other == "-":
                return f"{dst}: stdin is read from this file, and the output would replace it"
            if other is not None:
                if _file_id(other) == _file_id(src):
                    return f"{dst}: refusing to overwrite the input file {src} (write the output elsewhere)"
                return f"{dst}: the output of {src} would overwrite another input ({other})"
        else:  # not there yet: written first, it would then be read as that input
            other = names.get(os.path.realpath(dst))
            if other is not None and os.path.realpath(other) != os.path.realpath(src):
                return f"{dst}: the output of {src} is also given as an input ({other})"
    return None


def _input_ids(targets: list[tuple[str, str]]) -> dict[tuple[int, int] | None, str]:
    """(device, inode) of every input file, and of the file stdin was redirected from ("-"), to its name."""
    ids = {_file_id(src): src for src, _ in targets if src != "-" and os.path.isfile(src)}
    stdin = _stdin_file_id() if any(src == "-" for src, _ in targets) else None
    if stdin is not None:
        ids[stdin] = "-"
    ids.pop(None, None)  # an input that vanished: no id to compare with
    return ids


def _stdin_file_id() -> tuple[int, int] | None:
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


class MapError(AudioError):
    """The audio was written, its competition map was not: the file failed, and the summary names its output."""

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output


def write_competition(path: str, result: FileResult, ck: Checkpoint, source: str | bytes) -> None:
    """The maps of ``result`` into ``path``; ``source``: the input's path, or its bytes (stdin, pipes). Raises
    :class:`MapError` (the audio is already written when this runs)."""
    from enhance.competition_map import save_competition_map

    assert result.competition is not None
    try:
        save_competition_map(path, result.competition, ck, source, name=Path(result.input).name)
    except Exception as exc:  # the audio stays: it is complete, and was asked for
        raise MapError(
            f"{result.input}: enhanced into {result.output or '-'}, but its competition map failed: {exc}",
            output=str(result.output or "-"),
        ) from None


def _drop_stdout() -> None:
    """The reader of stdout went away: what is still buffered goes nowhere (not a second error at exit)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


class PendingStop:
    """The exception of a stop signal (Ctrl-C, SIGTERM, SIGHUP), kept until the command ends. Raised while
    libsndfile decodes audio held in memory (stdin, a pipe: read through cffi callbacks), it is printed and
    dropped there ("Exception ignored from cffi callback"), the decoding just stops, and the command wrote the
    output and exited 0 (a review saw 1 Ctrl-C in 12 and 2 SIGTERMs in 14 lost so). :meth:`check`, called
    after each block and before anything is written, raises it again."""

    raised: BaseException | None = None

    @classmethod
    def check(cls, _frames: int = 0) -> None:
        if cls.raised is not None:
            raise cls.raised


def _quiet_stops(unraisable: Any) -> None:
    """A stop dropped in libsndfile's read callback is raised again (:class:`PendingStop`): its "Exception ignored
    from cffi callback" traceback is not printed. Anything else is, as Python prints it."""
    if not isinstance(unraisable.exc_value, KeyboardInterrupt | SystemExit):
        sys.__unraisablehook__(unraisable)


def _interrupted(signum: int, frame: Any) -> None:
    """Ctrl-C: Python's own KeyboardInterrupt, kept for :class:`PendingStop`."""
    PendingStop.raised = KeyboardInterrupt()
    raise KeyboardInterrupt


def _terminated(signum: int, frame: Any, pipe: bool = False) -> None:
    """SIGTERM, or SIGHUP (the terminal or ssh session went away): unwind, so no temporary file is left."""
    if not isinstance(PendingStop.raised, SystemExit):  # said once, however often it is raised again
        print("enhance-cli: terminated" + ("" if pipe else " (no partial output is left)"), file=sys.stderr)
    PendingStop.raised = SystemExit(128 + signum)
    raise SystemExit(128 + signum)


class Stopped(Exception):
    """A stop signal during a batch, with the results so far: the files done, the one cut short and those not
    started (a Ctrl-C mid-batch printed no summary, not even with --json, nor said what was left undone)."""

    def __init__(self, results: list[FileResult], stop: BaseException) -> None:
        super().__init__("stopped")
        self.results, self.stop = results, stop


def _run_all(
    ck: Checkpoint,
    targets: list[tuple[str, str]],
    maps: list[str],
    args: argparse.Namespace,
    progress: Progress,
    backend: Any,
    say: Any,
) -> list[FileResult]:
    """Enhance every input in turn; one file's failure never stops the batch. A stop signal does: raised again
    as :class:`Stopped`, with every input's result (the one in progress and those after it failed)."""
    results: list[FileResult] = []
    for i, ((src, dst), map_path) in enumerate(zip(targets, maps, strict=True)):
        started = time.time()
        try:
            results.append(_run_one_of_batch(ck, src, dst, map_path, args, progress, backend, say))
        except (KeyboardInterrupt, SystemExit) as stop:
            results.append(_stopped_result(src, dst, map_path if args.competition_map else None, started))
            results.extend(FileResult(s, None, False, error=f"{s}: not started") for s, _ in targets[i + 1 :])
            raise Stopped(results, stop) from None
    return results


def _stopped_result(src: str, dst: str, map_path: str | None, started: float) -> FileResult:
    """The result of the input a stop signal came during: its output may already be in place (the signal came
    while its competition map was drawn, or its line printed), then it counts as done, or as missing its map."""
    written = (
        dst != "-" and os.path.isfile(dst) and os.stat(dst).st_mtime >= started - 0.05
    )  # (coarse clocks)
    if not written:
        return FileResult(src, None, False, error=f"{src}: stopped before it was finished")
    if map_path is not None and not (
        os.path.isfile(map_path) and os.stat(map_path).st_mtime >= started - 0.05
    ):
        return FileResult(
            src, dst, False, error=f"{src}: stopped after its audio was written, before its map"
        )
    return FileResult(src, dst, True)


def _run_one_of_batch(
    ck: Checkpoint,
    src: str,
    dst: str,
    map_path: str,
    args: argparse.Namespace,
    progress: Progress,
    backend: Any,
    say: Any,
) -> FileResult:
    """One input of :func:`_run_all`: its result, a failure reported and returned as one."""
    try:
        if args.competition_map and os.path.exists(map_path) and not args.overwrite:
            raise AudioError(f"{map_path}: competition map exists (use --overwrite)")
        if args.competition_map:  # before the audio is written: it stayed, and the file counted as failed
            blocked = nearest_existing(Path(map_path).parent)
            if blocked is not None and not blocked.is_dir():
                raise AudioError(f"{map_path}: cannot be written, {blocked} is not a folder")
            if blocked is not None and not os.access(blocked, os.W_OK):  # a read-only folder or mount
                raise AudioError(f"{map_path}: cannot be written, {blocked} is not writable")
        result = run_one(ck, src, dst, args, progress, backend, map_path)
        say(f"{src} -> {dst} ({result.duration_s:.1f} s audio in {result.wall_seconds:.1f} s)")
        for warning in result.warnings:  # also with --quiet, which quiets progress, not problems
            print(f"enhance-cli: warning: {warning}", file=sys.stderr)
    except Exception as exc:  # one file's failure never stops the batch, and never shows a traceback
        PendingStop.check()  # the failure of a read a stop signal cut short: the stop, not the file, ends it
        if isinstance(exc, BrokenPipeError) and dst == "-":
            msg = f"{src}: stdout was closed before all of the enhanced audio was written"
        elif isinstance(exc, AudioError):
            msg = str(exc)
        elif isinstance(exc, OSError | ValueError):
            msg = f"{src}: {exc}"
        else:
            msg = f"{src}: unexpected {type(exc).__name__}: {exc}"
        print(f"enhance-cli: error: {msg}", file=sys.stderr)
        if isinstance(exc, BrokenPipeError) and dst == "-":
            _drop_stdout()
        result = FileResult(src, getattr(exc, "output", None), False, error=msg)
    return result


def main(argv: list[str] | None = None) -> int:
    PendingStop.raised = None  # (tests call main more than once in a process)
    parser = build_parser()
    args = parser.parse_args(argv)
    # the handlers _main installs, given back at the end (for callers that run main in their own process)
    main_thread = threading.current_thread() is threading.main_thread()
    signals = [getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)]
    previous = [signal.getsignal(s) for s in signals] if main_thread else []
    hook = sys.unraisablehook
    try:
        return _main(parser, args)
    except KeyboardInterrupt:  # also while the model loads or a backend builds
        pipe = args.stream and "-" in args.inputs  # what it wrote is gone down the pipe already
        print("enhance-cli: interrupted" + ("" if pipe else " (no partial output is left)"), file=sys.stderr)
        return 130
    finally:
        sys.unraisablehook = hook
        for sig, handler in zip(signals, previous, strict=False):
            if handler is not None:
                signal.signal(sig, handler)


def _main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    try:
        inputs, left_out, collective = expand_inputs(args.inputs, args.output)
    except AudioError as exc:
        parser.error(str(exc))
    if left_out:
        print(
            f"enhance-cli: left out {left_out} earlier output file(s) found in the input folders",
            file=sys.stderr,
        )
    if not inputs:
        parser.error("no input files matched")
    # stdin twice: the first read all of it, and the second was "empty input" after audio had gone out
    if args.inputs.count("-") > 1:
        parser.error("'-' (stdin) can be read only once")
    many = len(inputs) > 1
    if many and args.output == "-":
        parser.error("-o - takes a single input")
    as_dir = many or collective  # a folder or a glob makes -o a folder even when it matched one file
    if as_dir and args.output == "-":
        parser.error("-o - takes a single file, not a folder or a glob")
    if as_dir and args.output and os.path.exists(args.output) and not os.path.isdir(args.output):
        parser.error(f"-o {args.output}: is a file, but several inputs (or a folder or glob) need a folder")
    if (
        as_dir
        and args.output not in (None, "-")
        and not args.output.endswith(("/", os.sep))
        and not os.path.exists(args.output)
        and Path(args.output).suffix.lower() in AUDIO_SUFFIXES
    ):  # a typo, not a wish for a folder named "one.wav"
        parser.error(
            f"-o {args.output}: several inputs (or a folder or glob) need a folder, and this is an audio file "
            f"name; give a folder (end it with '/' to make a folder of this name)"
        )
    if args.stream and "-" in args.inputs and args.output != "-":
        parser.error("--stream - reads raw PCM from stdin and writes it to stdout: use -o -")
    if args.subtype and args.subtype.upper() not in sf.available_subtypes():  # (named as the user spelt it)
        parser.error(f"--subtype {args.subtype}: not a sample format libsndfile knows (e.g. PCM_16, FLOAT)")
    if args.subtype:  # one spelling: 'float' clipped to [-1, 1] where 'FLOAT' did not
        args.subtype = args.subtype.upper()
    if sys.stdin is None and "-" in args.inputs:  # started with stdin closed (<&-)
        parser.error("stdin is closed: give an input file")
    if args.stream and "-" in args.inputs and (args.format or args.subtype):
        parser.error("--format and --subtype are for files: the raw PCM pipe writes --pcm samples")
    try:
        targets = [(src, output_for(src, rel, args.output, as_dir, args.format)) for src, rel in inputs]
    except AudioError as exc:
        parser.error(str(exc))
    if sys.stdout is None and any(dst == "-" for _, dst in targets):  # started with stdout closed (>&-)
        parser.error("stdout is closed: give -o a file name")
    if any(_is_stdout(dst) for _, dst in targets) and sys.stdout is not None and sys.stdout.isatty():
        where = f"-o {args.output}" if args.output else "stdout (where stdin's audio goes without -o)"
        parser.error(
            f"{where} would write binary audio to the terminal: pipe or redirect it (| or >), or give -o a file"
        )
    read = _input_ids(targets)
    overwritten = inputs_overwritten(targets, read) or unwritable(
        targets, args.output, args.format, args.subtype
    )
    if overwritten:
        parser.error(overwritten)
    maps = [map_target(args.competition_map, src, rel, many) for src, rel in inputs]
    replaced = next((m for m in maps if m and os.path.isfile(m) and _file_id(m) in read), None)
    if replaced:  # a map named like its input (take.npz) replaced the audio with a zip archive
        parser.error(f"--competition-map {replaced}: is an input file; the map would replace it")
    clash = clashes(targets) or (
        clashes([(src, m) for (src, _), m in zip(targets, maps, strict=True)])
        if args.competition_map
        else None
    )
    if clash:
        parser.error(clash)
    if (
        args.competition_map
        and many
        and not (args.competition_map.endswith("/") or os.path.isdir(args.competition_map))
    ):
        parser.error("--competition-map must name a folder (ending with '/') when there are several inputs")
    if (
        args.competition_map
        and not (args.competition_map.endswith("/") or os.path.isdir(args.competition_map))
        and Path(args.competition_map).suffix.lower() not in (".png", ".npz")
    ):
        parser.error("--competition-map must end with .png or .npz (or name a folder)")
    if args.competition_map and args.stream and "-" in args.inputs:
        parser.error("--competition-map is not available on the raw PCM pipe (--stream - -o -)")
    if args.competition_map and not args.competition_map.lower().endswith(".npz"):  # now, not after the audio
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("drawing .png maps needs matplotlib: pip install 'tim-enhance[viz]' (or use .npz)")
    if args.stream_backend and not args.stream:
        parser.error("--stream-backend needs --stream")
    pipe = {
        "--pcm": args.pcm,
        "--rate": args.rate,
        "--channels": args.channels,
        "--resampling": args.resampling,
    }
    if not (args.stream and "-" in args.inputs) and any(v is not None for v in pipe.values()):
        given = ", ".join(k for k, v in pipe.items() if v is not None)
        parser.error(f"{given}: only for the raw PCM pipe (--stream - -o -)")
    args.pcm, args.rate, args.channels = args.pcm or "s16le", args.rate or 16000, args.channels or 1
    if args.format and args.format.upper() == "OPUS":  # as `-o x.opus` names it: Opus in an Ogg container
        args.format, args.subtype = "OGG", args.subtype or "OPUS"
    refused = refused_container(args.format) if args.format else None
    if refused:
        parser.error(f"--format {args.format}: {refused}")
    if args.format and args.format.upper() not in sf.available_formats():
        parser.error(
            f"--format {args.format}: not a format this build can write "
            f"({', '.join(f for f in sf.available_formats() if not refused_container(f))})"
        )
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    try:
        inference_device(args.device)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        ck = load_model(args)
        # built once for all inputs, after load_model (the traced step bakes in the attenuation limit)
        backend = (
            streaming_backend(ck.model, args.stream_backend or "auto", threads=torch.get_num_threads())
            if args.stream
            else None
        )
    except (CheckpointError, RuntimeError, ValueError, ImportError) as exc:
        print(f"enhance-cli: error: {exc}", file=sys.stderr)
        return 2
    torch.set_grad_enabled(False)
    to_stdout = _is_stdout(args.output)  # then the --json summary goes to stderr, alone
    say = (lambda msg: None) if args.quiet or to_stdout else (lambda msg: print(msg, file=sys.stderr))
    progress = Progress(not args.quiet)
    if threading.current_thread() is threading.main_thread():  # a kill unwinds too: no temporary file is left
        handler = functools.partial(_terminated, pipe=args.stream and "-" in args.inputs)
        signal.signal(signal.SIGTERM, handler)
        hangup = getattr(signal, "SIGHUP", None)  # not on Windows
        if hangup is not None and signal.getsignal(hangup) is signal.SIG_DFL:  # (nohup: stays ignored)
            signal.signal(hangup, handler)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # (not a background job's SIG_IGN)
            signal.signal(signal.SIGINT, _interrupted)
        sys.unraisablehook = _quiet_stops
    stop: BaseException | None = None
    try:
        results = _run_all(ck, targets, maps, args, progress, backend, say)
    except Stopped as stopped:  # what was done, and what not, is said before the stop is raised again
        results, stop = stopped.results, stopped.stop
        if len(results) > 1:
            waiting = sum(1 for r in results if r.error and r.error.endswith(": not started"))
            last = results[len(results) - waiting - 1].input
            print(
                f"enhance-cli: stopped during {last}: {sum(r.ok for r in results)} of {len(results)} files "
                f"enhanced, {waiting} not started",
                file=sys.stderr,
            )
    if args.json:
        model_info: dict[str, Any] = {"name": ck.name, "training": ck.training}
        if not args.checkpoint:  # a bundled model: its card has what was measured since its export
            model_info["card"] = str(pretrained_path(args.model).with_suffix(".md"))
        if isinstance(ck.training, dict) and "evaluation" in ck.training:
            model_info["evaluation_note"] = (
                "training.evaluation was measured when these weights were exported; the signal path may have "
                "changed since (a bundled model's card holds later measurements)"
            )
        out = {
            "model": model_info,
            "files": [r.summary() for r in results],
            "ok": sum(r.ok for r in results),
            "failed": sum(not r.ok for r in results),
        }
        if stop is not None:
            out["stopped"] = True
        text = json.dumps(out, indent=2)
        if to_stdout:
            print(text, file=sys.stderr)
        else:
            print(text)
    if stop is not None:
        raise stop
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
