"""Quality benchmark: every system enhances the same paired test set in one run, and one table compares them.

    python bench/bench_quality.py --pairs ../shared/data [--limit N] [--no-dnsmos] [--model default]
        [--checkpoint NAME=PATH ...] [--systems a,b,c] [--out bench/results/quality]

Systems (``--systems`` picks and orders them; default: all of them): ``tim-<model>`` (the bundled model named
by ``--model``), one per ``--checkpoint NAME=PATH`` (named NAME), and the peers of ``bench/peers.py``:
deepfilternet3, rnnoise, nsnet2, webrtc (level 3 of 1-4; ``webrtc:N`` for another), speex, logmmse and
noisereduce (``noisereduce:stationary`` for its stationary mode). ``delay:N`` is a calibration check (the
input delayed by N samples). The peers are optional (``pip install -e '.[bench]'``): one that cannot be
imported or built is listed as "not run: <reason>" and the run goes on. The noisy input is always the first
row.

Each pair is read like ``recipes/evaluate.py`` does (channel 0, resampled to 16 kHz) and scored against its
clean file with :func:`recipes.metrics.compute_metrics`: wide-band PESQ, STOI, SI-SDR and DNSMOS P.835
SIG/BAK/OVRL (``--no-dnsmos`` leaves those NaN). A metric that fails is NaN, left out of the mean and counted
in ``n_failed``.

* **Delay**: before scoring, each system's output delay is measured once on a calibration signal
  (``--calibration``, default ``examples/noisy.wav``: synthetic speech in generated noise), as the lag in
  0-100 ms that maximises the input/output cross-correlation. A peer's output is then moved back by that
  delay: the peer is fed the file plus that many zeros (as a stream would be flushed) and its output from the
  delay on is scored, so no sample is lost. tim-enhance's output is aligned by construction; its delay is
  measured and reported but not removed.
* **Real-time factor**: compute time of each system's ``enhance`` call (wall clock, and CPU time of the
  process) summed over the files, divided by the summed duration of the files; one thread (OMP/MKL/OpenBLAS
  and torch threads = 1, ONNX Runtime sessions with one thread). Stream set-up (loading a model, creating its
  state) is not timed; resampling to and from a peer's native rate is.
* **Latency**: algorithmic latency in ms (see bench/peers.py); for a peer fed one hop at a time, hop +
  measured delay is checked against it and a mismatch is noted under the table.

Writes (each atomically) ``per_file.csv``, ``summary.csv``, ``summary.md`` and ``summary.png`` (a bar chart
per metric) to ``--out`` and prints the Markdown. Exit status: 0 done, 1 no file could be scored, 2 bad
arguments.
"""

from __future__ import annotations

import os

# one thread, set before numpy, torch and onnxruntime are imported
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import argparse
import contextlib
import math
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ (peers)
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

import numpy as np
import peers
import torch
from machine import cpu_summary  # bench/machine.py (bench/ is on sys.path when run as a script)
from tqdm import tqdm

from enhance.atomic_files import atomic_path
from enhance.audio_io import load_mono_16k
from enhance.errors import EnhanceError
from models import CheckpointError
from recipes.evaluate import summarize, write_csv
from recipes.metrics import DNSMOS, METRIC_KEYS, compute_metrics, metrics_problem
from recipes.pairs import discover_pairs, length_problem
from recipes.run_folder import out_folder_problem, write_text

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RATE = peers.RATE
MAX_LAG = int(peers.MAX_DELAY_MS * RATE / 1000)
DEFAULT_CALIBRATION = ROOT / "examples" / "noisy.wav"
DNSMOS_KEYS = ("dnsmos_sig", "dnsmos_bak", "dnsmos_ovrl")
PER_FILE_COLUMNS = ("name", "system", *METRIC_KEYS, "audio_s", "compute_s", "error")
SUMMARY_COLUMNS = (
    "system",
    "status",
    *METRIC_KEYS,
    "rtf",
    "rtf_cpu",
    "latency_ms",
    "delay_ms",
    "delay_samples",
    "native_rate",
    "hop_ms",
    "n_files",
    "n_failed",
    "source",
)
# Markdown columns: (header, summary key, decimals)
MD_COLUMNS = (
    ("PESQ", "pesq", 3),
    ("STOI", "stoi", 3),
    ("SI-SDR (dB)", "si_sdr", 2),
    ("DNSMOS SIG", "dnsmos_sig", 3),
    ("DNSMOS BAK", "dnsmos_bak", 3),
    ("DNSMOS OVRL", "dnsmos_ovrl", 3),
    ("RTF", "rtf", 4),
    ("CPU RTF", "rtf_cpu", 4),
)
PLOT_METRICS = (
    ("PESQ (wb)", "pesq"),
    ("STOI", "stoi"),
    ("SI-SDR (dB)", "si_sdr"),
    ("DNSMOS SIG", "dnsmos_sig"),
    ("DNSMOS BAK", "dnsmos_bak"),
    ("DNSMOS OVRL", "dnsmos_ovrl"),
    ("real-time factor (1 thread)", "rtf"),
)
NAN = math.nan


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


@dataclass
class Entry:
    """One row of the table: a system that runs (``system`` set) or one that could not (``reason``)."""

    name: str
    system: peers.System | None = None
    reason: str = ""
    delay: int = 0  # measured output delay on the calibration signal (samples at 16 kHz)
    shift: int = 0  # samples removed from the start of its output before scoring
    compute_s: float = 0.0
    cpu_s: float = 0.0
    audio_s: float = 0.0
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------------------
# systems


def parse_checkpoints(items: Sequence[str]) -> dict[str, Path]:
    """``NAME=PATH`` strings to an ordered dict; ValueError on bad syntax or a repeated name."""
    out: dict[str, Path] = {}
    for item in items:
        name, sep, path = item.partition("=")
        name = name.strip()
        if not sep or not name or not path:
            raise ValueError(f"--checkpoint expects NAME=PATH, got '{item}'")
        if name in out:
            raise ValueError(f"--checkpoint name '{name}' given twice")
        if peers.is_peer(name) or name == "noisy":
            raise ValueError(f"--checkpoint name '{name}' is taken by a peer or the noisy row")
        out[name] = Path(path)
    return out


def system_names(model: str | None, checkpoints: dict[str, Path], systems: str | None) -> list[str]:
    """The systems to run, in table order. ValueError for an unknown name, or a checkpoint named like the
    bundled model's row (that row, not the checkpoint, would have run under the name)."""
    if model and f"tim-{model}" in checkpoints:
        raise ValueError(
            f"--checkpoint name 'tim-{model}' is the bundled model's row (--model {model}); rename it"
        )
    ours = ([f"tim-{model}"] if model else []) + list(checkpoints)
    if systems is None:
        return [*ours, *peers.PEERS]
    names = [s.strip() for s in systems.split(",") if s.strip()]
    if not names:
        raise ValueError("--systems is empty")
    for name in names:
        if name not in ours and not peers.is_peer(name):
            known = ", ".join([*ours, *peers.PEERS, "webrtc:N", "noisereduce:stationary", "delay:N"])
            raise ValueError(f"unknown system '{name}' (known: {known})")
    if len(set(names)) != len(names):
        raise ValueError("--systems names a system twice")
    return names


def build_systems(names: Sequence[str], model: str | None, checkpoints: dict[str, Path]) -> list[Entry]:
    """Our systems must load (CheckpointError otherwise); a peer that cannot be built is a "not run" entry."""
    entries = []
    for name in names:
        if model and name == f"tim-{model}":
            entries.append(Entry(name, peers.TimSystem(name, model, bundled=True)))
        elif name in checkpoints:
            entries.append(Entry(name, peers.TimSystem(name, checkpoints[name])))
        else:
            try:
                system = peers.build_peer(name)
            except (ValueError, KeyError):
                raise
            except Exception as exc:  # ImportError, OSError, a broken package: reported, the run goes on
                entries.append(Entry(name, reason=_reason(exc)))
                _stderr(f"warning: {name} not run: {_reason(exc)}")
                continue
            entries.append(Entry(name, system))
    return entries


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:160] if text else type(exc).__name__


def calibration_audio(path: Path | None) -> tuple[np.ndarray, str]:
    """The calibration signal and its description: the file (ValueError if it is missing, unreadable or too quiet
    to measure a delay on), or bench/peers.py's generated one when ``path`` is None or the default file is absent
    (an installed package without examples/)."""
    if path is None or (path == DEFAULT_CALIBRATION and not path.is_file()):
        return peers.calibration_signal(), "generated speech-like signal (bench/peers.py)"
    try:
        signal = load_mono_16k(path)[0]
    except EnhanceError as exc:
        raise ValueError(f"--calibration: {exc}") from None
    if len(signal) < 2 * MAX_LAG or float(np.sqrt(np.mean(signal**2))) < 1e-3:
        raise ValueError(
            f"--calibration {path}: too short or too quiet to measure delays on (needs over "
            f"{2 * MAX_LAG / RATE:.1f} s of sound above -60 dBFS RMS)"
        )
    return signal, str(path)


def calibrate(entry: Entry, signal: np.ndarray) -> None:
    """Measure the system's output delay on ``signal`` and decide the shift applied before scoring."""
    assert entry.system is not None
    system = entry.system
    system.reset()
    entry.delay = peers.measure_delay(signal, system.enhance(signal), MAX_LAG)
    entry.shift = 0 if system.aligned else entry.delay
    if entry.delay >= MAX_LAG:
        entry.notes.append(
            f"{entry.name}: measured delay at the search limit ({MAX_LAG} samples): unreliable"
        )
    if system.aligned and entry.delay != 0:
        entry.notes.append(f"{entry.name}: measured delay {entry.delay} samples, expected 0 (not removed)")
    if system.streamed and system.hop_ms is not None and system.latency_ms is not None:
        derived = system.hop_ms + 1000.0 * entry.delay / RATE
        if abs(derived - system.latency_ms) > 1.0:
            entry.notes.append(
                f"{entry.name}: hop {system.hop_ms:g} ms + measured delay "
                f"{1000.0 * entry.delay / RATE:.2f} ms = "
                f"{derived:.2f} ms, but its documented latency is {system.latency_ms:g} ms"
            )


def run_system(entry: Entry, noisy: np.ndarray) -> tuple[np.ndarray | None, str]:
    """The system's output for ``noisy`` with its delay removed (same length), timed; (None, why) on error."""
    assert entry.system is not None
    system, n, shift = entry.system, len(noisy), entry.shift
    try:
        system.reset()
        x = np.pad(noisy, (0, shift)) if shift else noisy
        t0, c0 = time.perf_counter(), time.process_time()
        y = system.enhance(x)
        entry.compute_s += time.perf_counter() - t0
        entry.cpu_s += time.process_time() - c0
        entry.audio_s += n / RATE
    except Exception as exc:  # a peer failing on one file: its metrics are NaN for that file
        return None, _reason(exc)
    y = np.asarray(y, dtype=np.float32).reshape(-1)[shift : shift + n]
    if len(y) < n:
        y = np.pad(y, (0, n - len(y)))
    return y, ""


# ------------------------------------------------------------------------------------------------------------
# scoring and reports


def summary_rows(
    entries: Sequence[Entry], means: dict[str, dict[str, float]], raised: dict[str, int] | None = None
) -> list[dict[str, Any]]:
    """The rows of summary.csv: noisy first, then every system, run or not. ``raised``: per system, the files
    on which it raised (its error column): "failed on every file" means that, not a metric that could not be
    computed on its output (a silent output has no PESQ, but its STOI and SI-SDR are scores)."""
    raised = raised or {}
    empty = dict.fromkeys(METRIC_KEYS, NAN)
    rows: list[dict[str, Any]] = [
        {
            "system": "noisy",
            "status": "ok",
            **means.get("noisy", {**empty, "n_files": 0, "n_failed": 0}),
            "rtf": NAN,
            "rtf_cpu": NAN,
            "latency_ms": 0.0,
            "delay_ms": 0.0,
            "delay_samples": 0,
            "native_rate": RATE,
            "hop_ms": NAN,
            "source": "the noisy input",
        }
    ]
    for e in entries:
        s = e.system
        row: dict[str, Any] = {"system": e.name, "status": "ok" if s is not None else f"not run: {e.reason}"}
        row.update(means.get(e.name, {**empty, "n_files": 0, "n_failed": 0}))
        if s is not None and row["n_files"] and raised.get(e.name, 0) >= row["n_files"]:
            row["status"] = "failed on every file"
        has_audio = s is not None and e.audio_s > 0
        row["rtf"] = e.compute_s / e.audio_s if has_audio else NAN
        row["rtf_cpu"] = e.cpu_s / e.audio_s if has_audio else NAN
        latency = s.latency_ms if s is not None else None
        row["latency_ms"] = float(latency) if latency is not None else NAN
        row["delay_ms"] = 1000.0 * e.delay / RATE if s is not None else NAN
        row["delay_samples"] = e.delay if s is not None else ""
        row["native_rate"] = s.native_rate if s is not None else ""
        row["hop_ms"] = float(s.hop_ms) if s is not None and s.hop_ms is not None else NAN
        row["source"] = _source(s) if s is not None else ""
        rows.append(row)
    return rows


def _source(system: peers.System) -> str:
    source = getattr(system, "source", None)
    if source:
        return str(source)
    if isinstance(system, peers.DelayedIdentity):
        return f"calibration check: the input delayed by {system.samples} samples"
    version = getattr(system, "version", "")
    dist = peers.PEERS.get(system.name.partition(":")[0], (None, ""))[1]
    return f"{dist} {version}".strip()


def _cell(value: Any, decimals: int) -> str:
    if isinstance(value, float | int) and math.isfinite(float(value)):
        return f"{float(value):.{decimals}f}"
    return "n/a"


def markdown(rows: list[dict[str, Any]], entries: Sequence[Entry], header: str, notes: Sequence[str]) -> str:
    """summary.md: the header, the table (noisy first) and the notes."""
    latency_text = {e.name: e.system.latency_note for e in entries if e.system is not None}
    cols = [h for h, _, _ in MD_COLUMNS]
    lines = [
        header,
        "",
        "| system | " + " | ".join(cols) + " | latency (ms) | measured delay (ms) | n_files | n_failed |",
        "|---|" + "---|" * (len(cols) + 4),
    ]
    for row in rows:
        if row["status"] != "ok":
            lines.append(f"| {row['system']} | {row['status']} |" + " |" * (len(cols) + 3))
            continue
        cells = [_cell(row[key], dec) for _, key, dec in MD_COLUMNS]
        if row["system"] == "noisy":
            cells[-2:] = ["–", "–"]
            latency, delay = "–", "–"
        else:
            lat = row["latency_ms"]
            latency = f"{lat:g}" if math.isfinite(lat) else latency_text.get(row["system"], "n/a")
            delay = f"{row['delay_ms']:.2f}"
        lines.append(
            f"| {row['system']} | " + " | ".join(cells) + f" | {latency} | {delay} | {int(row['n_files'])} | "
            f"{int(row['n_failed'])} |"
        )
    lines.append("")
    lines.extend(f"- {note}" for note in notes)
    return "\n".join(lines) + "\n"


def plot(path: Path, rows: list[dict[str, Any]], ours: set[str]) -> str | None:
    """summary.png: one bar chart per metric (systems that ran, noisy first; grey noisy, blue tim-enhance,
    orange peers); returns why there is none, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"no plot ({_reason(exc)}; pip install matplotlib)"
    ran = [r for r in rows if r["status"] == "ok"]
    panels = [(title, key) for title, key in PLOT_METRICS if any(math.isfinite(float(r[key])) for r in ran)]
    if not ran or not panels:
        return "no plot (nothing to show)"
    ncols = min(3, len(panels))
    nrows = -(-len(panels) // ncols)
    width = max(4.0, 0.45 * len(ran) + 1.5)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, 3.6 * nrows), squeeze=False)
    for ax, (title, key) in zip(axes.flat, panels, strict=False):
        shown = [r for r in ran if not (key == "rtf" and r["system"] == "noisy")]
        names = [r["system"] for r in shown]
        colors = ["0.6" if n == "noisy" else "tab:blue" if n in ours else "tab:orange" for n in names]
        values = [float(r[key]) for r in shown]
        drawn = [
            v if math.isfinite(v) else 0.0 for v in values
        ]  # no bar, and "n/a" on it: not a zero (or a speed)
        ax.bar(range(len(names)), drawn, color=colors)
        for i, v in enumerate(values):
            if not math.isfinite(v):
                ax.text(i, 0, "n/a", ha="center", va="bottom", fontsize=7, rotation=90)
        ax.set_title(title)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=45, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
        os.chmod(tmp, 0o644)
    plt.close(fig)
    return None


def header_text(
    argv: Sequence[str], layout: str, root: Path, n_pairs: int, dnsmos: bool, calibration: str
) -> str:
    return (
        f"Quality benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {platform.platform()}, {cpu_summary()}, "
        f"one thread per system; Python {platform.python_version()}, torch "
        f"{torch.__version__}.\n\n"
        f"Test set: {n_pairs} pairs, {layout} layout, under `{root}`. DNSMOS: {'on' if dnsmos else 'off'}. "
        f"Delays measured on {calibration}.\n\n"
        f"Command: `{' '.join(['python', *map(shlex.quote, argv)])}`"
    )


def table_notes(entries: Sequence[Entry], computed_notes: Sequence[str]) -> list[str]:
    notes = [
        "PESQ is wide-band (P.862.2), STOI classic, SI-SDR in dB, DNSMOS P.835 (non-intrusive); means over "
        "the files where the metric is finite for every system; n_failed counts files with any NaN metric.",
        "RTF: compute seconds / audio seconds on one thread (wall clock; CPU RTF is the process's CPU time), "
        "resampling to a peer's native rate included, stream set-up excluded.",
        "measured delay: the output lag (0-100 ms) maximising the input/output cross-correlation on the "
        "calibration signal; removed from every peer's output before scoring (tim-enhance is aligned by "
        "construction and not shifted).",
    ]
    for e in entries:
        if e.system is not None:
            s = e.system
            rate = f"{s.native_rate / 1000:g} kHz" + (
                f", hop {s.hop_ms:g} ms" if s.hop_ms is not None else ""
            )
            remark = getattr(s, "remark", "")
            notes.append(
                f"{e.name} ({_source(s)}; {rate}): latency {s.latency_note}"
                + (f"; {remark}." if remark else ".")
            )
    notes.extend(computed_notes)
    for name, why in peers.UNAVAILABLE.items():
        notes.append(f"not benchmarked: {name}: {why}.")
    return notes


def write_reports(
    out: Path, per_file: list[dict[str, Any]], rows: list[dict[str, Any]], md: str, ours: set[str]
) -> str | None:
    """per_file.csv, summary.csv, summary.md and summary.png, each written atomically; returns why there is no
    plot, or None."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "per_file.csv", PER_FILE_COLUMNS, per_file)
    write_csv(out / "summary.csv", SUMMARY_COLUMNS, rows)
    write_text(out / "summary.md", md)
    why = plot(out / "summary.png", rows, ours)
    if why:  # an earlier run's figure would contradict the tables beside it
        (out / "summary.png").unlink(missing_ok=True)
    return why


# ------------------------------------------------------------------------------------------------------------
# command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench_quality.py",
        description="Enhance a paired test set with every system and compare PESQ, STOI, SI-SDR, DNSMOS, "
        "real-time factor and latency in one table.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="peers: " + ", ".join(peers.PEERS) + "; also webrtc:1..4, noisereduce:stationary, delay:N",
    )
    parser.add_argument(
        "--pairs", type=Path, required=True, help="test-set root (dev, DNS or VoiceBank layout)"
    )
    parser.add_argument("--limit", type=int, help="only the first N pairs (sorted by name)")
    parser.add_argument("--no-dnsmos", action="store_true", help="skip DNSMOS (its columns are n/a)")
    parser.add_argument(
        "--model",
        default="default",
        help="bundled tim-enhance model, row 'tim-NAME' (default: default; '' for none)",
    )
    parser.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a tim-enhance checkpoint to compare, row NAME (repeatable)",
    )
    parser.add_argument("--systems", help="comma-separated systems to run, in this order (default: all)")
    parser.add_argument(
        "--calibration",
        type=Path,
        default=DEFAULT_CALIBRATION,
        help="audio to measure each system's delay on (default: examples/noisy.wav)",
    )
    parser.add_argument(  # no default: a first run on one's own pairs replaced the README's results
        "--out",
        type=Path,
        required=True,
        help="output folder, its tables replaced (bench/results/quality holds the README's, on the shared dev pairs)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    shown_argv = [sys.argv[0], *(sys.argv[1:] if argv is None else argv)]
    torch.set_num_threads(1)
    with contextlib.suppress(RuntimeError):  # already set, or parallel work already started in this process
        torch.set_num_interop_threads(1)
    try:
        if args.limit is not None and args.limit < 1:
            raise ValueError(f"--limit must be at least 1, got {args.limit}")
        found = discover_pairs(args.pairs)
        checkpoints = parse_checkpoints(args.checkpoint)
        names = system_names(args.model or None, checkpoints, args.systems)
        entries = build_systems(names, args.model or None, checkpoints)
        signal, calibration = calibration_audio(args.calibration)
        # found now, not after the whole run
        problem = out_folder_problem(args.out) or metrics_problem(not args.no_dnsmos)
        if problem:
            raise ValueError(problem)
    except (ValueError, KeyError, CheckpointError, OSError) as exc:
        _stderr(f"error: {exc.args[0] if isinstance(exc, KeyError) else exc}")
        return 2
    for warning in found.warnings:
        _stderr(f"warning: {warning}")
    pairs = found.pairs[: args.limit] if args.limit else found.pairs
    _stderr(f"{found.layout} layout: {len(found.pairs)} pairs under {found.root}, scoring {len(pairs)}")

    for e in entries:
        if e.system is None:
            continue
        try:
            calibrate(e, signal)
        except Exception as exc:  # a peer that cannot process audio at all is not run
            e.system, e.reason = None, f"failed on the calibration signal: {_reason(exc)}"
            _stderr(f"warning: {e.name} not run: {e.reason}")
            continue
        _stderr(f"{e.name}: measured delay {e.delay} samples ({1000.0 * e.delay / RATE:.2f} ms)")
    running = [e for e in entries if e.system is not None]

    scorer = None if args.no_dnsmos else DNSMOS(num_threads=1)
    computed = METRIC_KEYS if scorer is not None else tuple(k for k in METRIC_KEYS if k not in DNSMOS_KEYS)
    per_file: list[dict[str, Any]] = []
    skipped = multichannel = 0
    mismatched: list[str] = []
    show = sys.stderr.isatty()
    for pair in tqdm(pairs, desc="bench", unit="file", disable=not show, file=sys.stderr):
        try:
            clean, _, clean_channels = load_mono_16k(pair.clean_path)
            noisy, _, noisy_channels = load_mono_16k(pair.noisy_path)
        except EnhanceError as exc:
            skipped += 1
            _stderr(f"skipped {pair.name}: {exc}")
            continue
        # scored as recipes.evaluate scores them, and said as it says it (a mis-paired file was scored on the
        # shorter length without a word)
        mismatch = length_problem(len(noisy), len(clean))
        if mismatch:
            mismatched.append(f"{pair.name}: {mismatch}")
            _stderr(f"warning: {pair.name}: {mismatch}; scored on the shorter length")
        if max(clean_channels, noisy_channels) > 1:
            multichannel += 1
        audio_s = len(noisy) / RATE
        base = {"name": pair.name, "audio_s": audio_s}
        per_file.append(
            {
                **base,
                "system": "noisy",
                **compute_metrics(clean, noisy, scorer),
                "compute_s": NAN,
                "error": "",
            }
        )
        for e in running:
            before = e.compute_s
            enhanced, error = run_system(e, noisy)
            if enhanced is None:
                _stderr(f"{e.name} failed on {pair.name}: {error}")
                scores = dict.fromkeys(METRIC_KEYS, NAN)
            else:
                scores = compute_metrics(clean, enhanced, scorer)
            per_file.append(
                {**base, "system": e.name, **scores, "compute_s": e.compute_s - before, "error": error}
            )

    if not any(r["system"] == "noisy" for r in per_file):  # before writing: earlier results stay as they were
        _stderr(f"error: no file could be scored; nothing written to {args.out}")
        return 1
    means = summarize(per_file, computed, systems=["noisy", *(e.name for e in running)])
    raised: dict[str, int] = {}
    for r in per_file:
        if r["error"]:
            raised[r["system"]] = raised.get(r["system"], 0) + 1
    rows = summary_rows(entries, means, raised)
    notes = [n for e in running for n in e.notes]
    if skipped:
        notes.append(f"{skipped} pair(s) skipped: unreadable files")
    notes += [
        f"test set: {w}" for w in found.warnings
    ]  # unpaired files, in the table's notes, not only stderr
    notes += [f"scored on the shorter length (mis-paired?): {m}" for m in mismatched]
    if multichannel:
        notes.append(f"{multichannel} pair(s) with more than one channel: channel 0 enhanced and scored")
    header = header_text(shown_argv, found.layout, found.root, len(pairs), scorer is not None, calibration)
    md = markdown(rows, entries, header, table_notes(entries, notes))
    ours = {e.name for e in running if isinstance(e.system, peers.TimSystem)}
    why = write_reports(args.out, per_file, rows, md, ours)
    print(md, end="")
    if why:
        _stderr(f"warning: {why}")
    _stderr(f"wrote {args.out}/per_file.csv, summary.csv, summary.md" + ("" if why else ", summary.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
