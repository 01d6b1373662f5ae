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
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

import soundfile as sf
import torch

from enhance.arguments import attenuation_db, number, package_version
from enhance.atomic_files import nearest_existing
from enhance.audio_io import (
    AUDIO_SUFFIXES,
    MAX_CHANNELS,
    MAX_STREAM_RATE,
    MIN_RATE,
    AudioError,
    fs_path,
    missing,
    output_format,
    read_piped,
    refused_container,
)
from enhance.backends import BACKENDS, REDUCED_PRECISION, streaming_backend
from enhance.device import inference_device
from enhance.files import FileOptions, FileResult, enhance_bytes, enhance_file, new_output
from enhance.pcm import PCM_FORMATS
from enhance.pipe import stream_pcm
from enhance.stop_signals import PendingStop, interrupted, quiet_stops, terminated
from enhance.targets import (
    clashes,
    expand_inputs,
    file_id,
    input_ids,
    inputs_overwritten,
    is_special,
    is_stdout,
    map_target,
    output_for,
    special_output,
    unwritable,
)
from models.checkpoint import Checkpoint, CheckpointError, load_checkpoint, read_metadata
from models.pretrained import DEFAULT_MODEL, load_pretrained, pretrained_path


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
    s.add_argument("--pcm", choices=list(PCM_FORMATS), help="raw pipe sample format (default s16le)")
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
    pipe_in = src != "-" and is_special(src)  # a named pipe, /dev/stdin, <(...): read once, into memory
    # /dev/stdout, /dev/null, a named pipe: written in place (a temp file renamed over it would replace it)
    pipe_out = dst != "-" and special_output(dst)
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
            n, warnings = stream_pcm(
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
                warnings=warnings,
            )
        options = FileOptions(
            block_seconds=args.chunk_seconds,
            stream_block=ck.config.stft.hop_length if args.stream else None,
            with_competition=want_maps,
            backend=backend,
            high_band=args.high_band == "gate",
        )
        if dst != "-" and src != "-" and not pipe_in and not pipe_out:
            result = enhance_file(
                ck.model,
                src,
                dst,
                overwrite=args.overwrite,
                out_format=args.format,
                out_subtype=args.subtype,
                options=options,
                on_progress=progress.update,
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
            options=options,
            on_progress=PendingStop.check,  # a stop signal lost in libsndfile's read callback: raised again
            format_chosen=args.format is not None,
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

    def fresh(path: str) -> bool:  # written since the input was started (coarse file clocks: 50 ms slack)
        return os.path.isfile(path) and os.stat(path).st_mtime >= started - 0.05

    if dst == "-" or not fresh(dst):
        return FileResult(src, None, False, error=f"{src}: stopped before it was finished")
    if map_path is not None and not fresh(map_path):
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
    targets, maps = _checked_targets(parser, args)  # every usage error before the model loads
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
    to_stdout = is_stdout(args.output)  # then the --json summary goes to stderr, alone
    say = (lambda msg: None) if args.quiet or to_stdout else (lambda msg: print(msg, file=sys.stderr))
    progress = Progress(not args.quiet)
    if threading.current_thread() is threading.main_thread():
        _install_stop_handlers(args.stream and "-" in args.inputs)
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
        text = json.dumps(_json_summary(args, ck, results, stop is not None), indent=2)
        print(text, file=sys.stderr if to_stdout else sys.stdout)
    if stop is not None:
        raise stop
    return 0 if all(r.ok for r in results) else 1


def _install_stop_handlers(pipe: bool) -> None:
    """A kill, a hang-up or Ctrl-C unwinds the command: no temporary file is left (main restores the handlers)."""
    handler = functools.partial(terminated, pipe=pipe)
    signal.signal(signal.SIGTERM, handler)
    hangup = getattr(signal, "SIGHUP", None)  # not on Windows
    if hangup is not None and signal.getsignal(hangup) is signal.SIG_DFL:  # (nohup: stays ignored)
        signal.signal(hangup, handler)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # (not a background job's SIG_IGN)
        signal.signal(signal.SIGINT, interrupted)
    sys.unraisablehook = quiet_stops


def _json_summary(
    args: argparse.Namespace, ck: Checkpoint, results: list[FileResult], stopped: bool
) -> dict[str, Any]:
    """``--json``: the model and each file's outcome."""
    model_info: dict[str, Any] = {"name": ck.name, "training": ck.training}
    if not args.checkpoint:  # a bundled model: its card has what was measured since its export
        model_info["card"] = str(pretrained_path(args.model).with_suffix(".md"))
    if isinstance(ck.training, dict) and "evaluation" in ck.training:
        model_info["evaluation_note"] = (
            "training.evaluation was measured when these weights were exported; the signal path may have "
            "changed since (a bundled model's card holds later measurements)"
        )
    out: dict[str, Any] = {
        "model": model_info,
        "files": [r.summary() for r in results],
        "ok": sum(r.ok for r in results),
        "failed": sum(not r.ok for r in results),
    }
    if stopped:
        out["stopped"] = True
    return out


def _checked_targets(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[list[tuple[str, str]], list[str]]:
    """The (input, output) pairs and competition-map paths the arguments ask for, with every usage error
    (``parser.error``: exit 2) found before the model loads; normalises ``args`` (subtype, format, pipe
    defaults) and applies ``--threads``."""
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
    if any(is_stdout(dst) for _, dst in targets) and sys.stdout is not None and sys.stdout.isatty():
        where = f"-o {args.output}" if args.output else "stdout (where stdin's audio goes without -o)"
        parser.error(
            f"{where} would write binary audio to the terminal: pipe or redirect it (| or >), or give -o a file"
        )
    read = input_ids(targets)
    overwritten = inputs_overwritten(targets, read) or unwritable(
        targets, args.output, args.format, args.subtype
    )
    if overwritten:
        parser.error(overwritten)
    maps = [map_target(args.competition_map, src, rel, many) for src, rel in inputs]
    replaced = next((m for m in maps if m and os.path.isfile(m) and file_id(m) in read), None)
    if replaced:  # a map named like its input (take.npz) replaced the audio with a zip archive
        parser.error(f"--competition-map {replaced}: is an input file; the map would replace it")
    clash = clashes(targets) or (
        clashes([(src, m) for (src, _), m in zip(targets, maps, strict=True)])
        if args.competition_map
        else None
    )
    if clash:
        parser.error(clash)
    audio_out = {os.path.normcase(os.path.abspath(dst)) for _, dst in targets if dst != "-"}
    on_audio = next((m for m in maps if m and os.path.normcase(os.path.abspath(m)) in audio_out), None)
    if on_audio:  # written after the audio, it replaced the enhanced file, and the run said "ok"
        parser.error(
            f"--competition-map {on_audio}: is also an audio output; the map would replace the enhanced audio "
            "(give them distinct names)"
        )
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
    return targets, maps


if __name__ == "__main__":
    sys.exit(main())
