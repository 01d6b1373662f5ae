"""Evaluate a model on a paired test set: PESQ, STOI, SI-SDR and DNSMOS of the noisy input and the enhanced output.

    python -m recipes.evaluate --checkpoint runs/tim/best.safetensors --pairs ../shared/data --out runs/tim/eval

Each pair's noisy file is read (channel 0 of a multichannel file, resampled to 16 kHz if needed), enhanced with
:func:`enhance.offline.enhance_waveform`, and both the noisy input and the enhanced output are scored against the
clean file (cut to the shorter length). Files that cannot be read are skipped with their reason. Written to
``--out`` (each file atomically): ``per_file.csv``, ``summary.csv`` (with the counts of skipped and unpaired files on
every row), ``summary.md`` and ``summary.json``. The
summary has one row per system (noisy, then enhanced): each metric's mean over the files where it is finite for
both (so the rows cover the same files), ``n_files`` (files scored) and ``n_failed`` (files where any computed metric was NaN).
"""

from __future__ import annotations

import enhance.wait_policy  # noqa: F401  (first: OpenMP reads its waiting policy when torch loads it)

# isort: split
import argparse
import contextlib
import csv
import io
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from enhance.arguments import attenuation_db
from enhance.audio_io import MODEL_RATE, load_mono_16k
from enhance.device import inference_device, usable_device
from enhance.errors import EnhanceError
from enhance.offline import enhance_waveform
from models import CheckpointError, Enhancer, get_config, load_checkpoint
from models.checkpoint import file_sha256
from recipes.interrupt import on_interrupt
from recipes.metrics import DNSMOS, METRIC_KEYS, compute_metrics, failure_reason, metrics_problem
from recipes.pairs import Pair, discover_pairs, length_problem
from recipes.run_folder import out_folder_problem, read_csv, write_text

SYSTEMS = ("noisy", "enhanced")
DNSMOS_KEYS = ("dnsmos_sig", "dnsmos_bak", "dnsmos_ovrl")
SUMMARY_COLUMNS = ("system", *METRIC_KEYS, "n_files", "n_failed")
# summary.csv also says, on every row, how many files the table leaves out (summary.md lists them under it)
CSV_COLUMNS = (*SUMMARY_COLUMNS, "n_skipped", "n_unpaired")
_DECIMALS = {"pesq": 3, "stoi": 3, "si_sdr": 2, "dnsmos_sig": 3, "dnsmos_bak": 3, "dnsmos_ovrl": 3}

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def _scorer(dnsmos: bool | DNSMOS) -> DNSMOS | None:
    if isinstance(dnsmos, DNSMOS):
        return dnsmos
    return DNSMOS() if dnsmos else None


def score_pair(
    model: Enhancer, pair: Pair, scorer: DNSMOS | None
) -> tuple[dict[str, dict[str, float]], dict[str, int], str | None, dict[str, str]]:
    """Metrics of the noisy input and of the enhanced output of one pair, what loading had to convert, why
    the pair looks mis-paired (:func:`recipes.pairs.length_problem`; None: it does not), and per system why a
    metric may be NaN (:func:`recipes.metrics.failure_reason`).

    Raises :class:`enhance.errors.EnhanceError` when a file cannot be read or enhanced.
    """
    clean, clean_rate, clean_ch = load_mono_16k(pair.clean_path)
    noisy, noisy_rate, noisy_ch = load_mono_16k(pair.noisy_path)
    enhanced = enhance_waveform(model, noisy[np.newaxis, :]).wav[0]
    scores = {
        "noisy": compute_metrics(clean, noisy, scorer),
        "enhanced": compute_metrics(clean, enhanced, scorer),
    }
    notes = {
        "resampled": int(clean_rate != MODEL_RATE or noisy_rate != MODEL_RATE),
        "multichannel": int(clean_ch > 1 or noisy_ch > 1),
        "length_mismatch": int(len(clean) != len(noisy)),
    }
    reasons = {"noisy": failure_reason(clean, noisy), "enhanced": failure_reason(clean, enhanced)}
    return scores, notes, length_problem(len(noisy), len(clean)), reasons


def summarize(
    rows: list[dict[str, Any]],
    metrics: Sequence[str] = METRIC_KEYS,
    systems: Sequence[str] = SYSTEMS,
    keys: Sequence[str] = METRIC_KEYS,
) -> dict[str, dict[str, float]]:
    """Per system of ``systems`` (rows carry ``system`` and the file's ``name``): the mean of each of ``keys`` over
    the files where it is finite for every system that scored any file on it (NaN when there are none), ``n_files``
    and ``n_failed``. The rows of a table are then means over the same files: a system whose output makes a metric
    fail on a file (PESQ of an all-zero output) does not leave that file out of its own mean alone. A system that
    failed on every file has NaN there and does not narrow the others' files.

    ``n_failed`` counts files where any of ``metrics`` (those actually computed) is NaN.
    """
    out: dict[str, dict[str, float]] = {}
    by_system = {system: {r["name"]: r for r in rows if r["system"] == system} for system in systems}

    def finite(system: str, name: str, key: str) -> bool:
        row = by_system[system].get(name)
        return row is not None and math.isfinite(float(row[key]))

    common: dict[str, set[str]] = {}
    for key in keys:
        scoring = [s for s in systems if any(finite(s, n, key) for n in by_system[s])]
        names = set().union(*(by_system[s] for s in scoring)) if scoring else set()
        common[key] = {n for n in names if all(finite(s, n, key) for s in scoring)}
    for system in systems:
        mine = list(by_system[system].values())
        entry: dict[str, float] = {}
        for key in keys:
            values = [float(r[key]) for name, r in by_system[system].items() if name in common[key]]
            entry[key] = float(np.mean(values)) if values else math.nan
        entry["n_files"] = len(mine)
        entry["n_failed"] = sum(1 for r in mine if any(not math.isfinite(float(r[k])) for k in metrics))
        out[system] = entry
    return out


def _csv_value(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if not math.isfinite(value) else f"{value:.6f}"
    return str(value)


def _as_written(scores: dict[str, float]) -> dict[str, float]:
    """Scores rounded as :func:`_csv_value` writes them."""
    return {k: round(v, 6) if math.isfinite(v) else v for k, v in scores.items()}


def write_csv(path: Path, columns: Sequence[str], rows: list[dict[str, Any]]) -> None:
    """Write ``rows`` (dicts) as CSV atomically; NaN is written as ``nan``."""
    buf = io.StringIO(newline="")
    writer = csv.writer(buf)
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_csv_value(row[c]) for c in columns])
    write_text(path, buf.getvalue())


def markdown_table(summary: dict[str, dict[str, float]]) -> str:
    """The summary as a Markdown table (NaN shown as ``n/a``)."""
    lines = ["| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "|".join("---" for _ in SUMMARY_COLUMNS) + "|"]
    for system, entry in summary.items():
        cells = [system]
        for key in SUMMARY_COLUMNS[1:]:
            v = entry[key]
            if key in _DECIMALS:
                cells.append(f"{v:.{_DECIMALS[key]}f}" if math.isfinite(v) else "n/a")
            else:
                cells.append(str(int(v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def json_safe(value: Any) -> Any:
    """NaN/inf floats become null (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def write_outputs(out_dir: Path, rows: list[dict[str, Any]], result: dict[str, Any]) -> None:
    """per_file.csv, summary.csv, summary.md and summary.json, each written atomically."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(out_dir / "per_file.csv", ("name", "system", *METRIC_KEYS), rows)
    left = {"n_skipped": len(result.get("skipped") or []), "n_unpaired": len(result.get("unpaired") or [])}
    summary_rows = [{"system": s, **entry, **left} for s, entry in result["summary"].items()]
    write_csv(out_dir / "summary.csv", CSV_COLUMNS, summary_rows)
    write_text(out_dir / "summary.md", markdown_table(result["summary"]) + left_out(result))
    write_text(out_dir / "summary.json", json.dumps(json_safe(result), indent=2) + "\n")


def left_out(result: dict[str, Any]) -> str:
    """What the table does not cover, under it: files skipped while scoring, and files that paired with nothing
    (they were only printed, so a report could lose files without saying so)."""
    text = ""
    if result.get("interrupted"):
        text += (
            f"\n**Interrupted**: {result['n_evaluated']} of the {result['n_pairs']} pairs were scored before "
            "it; the table covers those.\n"
        )
    skipped = result.get("skipped") or []
    if skipped:
        text += f"\nSkipped while scoring ({len(skipped)} file(s)):\n\n"
        text += "".join(f"- {s['name']}: {s['reason']}\n" for s in skipped)
    if result.get("unpaired"):
        text += f"\nLeft out, no partner found ({len(result['unpaired'])}):\n\n"
        text += "".join(f"- {w}\n" for w in result["unpaired"])
    mismatched = result.get("length_mismatched") or []
    if mismatched:
        text += f"\nScored, but their sides' lengths differ (cut to the shorter; {len(mismatched)}):\n\n"
        text += "".join(f"- {m['name']}: {m['reason']}\n" for m in mismatched)
    failed = result.get("failed") or []
    if failed:
        text += f"\nMetrics not computed (NaN: n_failed; {len(failed)}):\n\n"
        text += "".join(
            f"- {f['name']}, {f['system']}: {', '.join(f['metrics'])}: {f['reason']}\n" for f in failed
        )
    return text


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Ctrl-C held back until the block ends, then handled as it would have been (KeyboardInterrupt). Only in the
    main thread, where Python runs signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending and callable(previous):
            previous(signal.SIGINT, None)


@dataclass
class Resumed:
    """What an interrupted evaluation had scored (its reports), for ``--resume`` to go on from."""

    rows: list[dict[str, Any]]  # per_file.csv
    skipped: list[dict[str, str]]
    mismatched: list[dict[str, str]]
    failed: list[dict[str, Any]]
    notes: dict[str, int]
    elapsed_s: float  # the time the interrupted sessions took

    @property
    def scored(self) -> set[str]:
        return {r["name"] for r in self.rows}

    @property
    def done(self) -> set[str]:
        return self.scored | {s["name"] for s in self.skipped}


# the settings an evaluation must share with the one it resumes (the command line and the device may change)
RESUME_KEYS = (
    "checkpoint",
    "model_config",
    "seed",
    "pairs",
    "layout",
    "limit",
    "max_attenuation_db",
    "dnsmos",
    "checkpoint_sha256",  # the checkpoint's path alone took other weights saved there since for the same model
)


def resumable(out_dir: Path, settings: dict[str, Any]) -> Resumed:
    """The reports of the interrupted evaluation in ``out_dir``, if it was made with the same ``settings``;
    ValueError with the reason otherwise."""
    try:
        report = json.loads((out_dir / "summary.json").read_text())
        rows = read_rows(out_dir / "per_file.csv")
    except (OSError, ValueError) as exc:
        raise ValueError(f"--resume: {out_dir} holds no readable evaluation ({exc})") from None
    if not isinstance(report, dict) or not isinstance(report.get("settings", {}), dict):
        raise ValueError(f"--resume: {out_dir} holds no readable evaluation (summary.json is not one's)")
    if not report.get("interrupted"):
        raise ValueError(f"--resume: the evaluation in {out_dir} is complete: nothing to resume")
    then = {**report.get("settings", {}), "dnsmos": report.get("dnsmos")}
    changed = [
        f"{k}: {then.get(k)!r} then, {settings.get(k)!r} now"
        for k in RESUME_KEYS
        if then.get(k) != settings.get(k)
    ]
    if changed:
        raise ValueError(f"--resume: not the evaluation in {out_dir} ({'; '.join(changed)}); use a new --out")
    return Resumed(
        rows,
        report.get("skipped", []),
        report.get("length_mismatched", []),
        report.get("failed", []),
        report.get("files_converted", {}),
        float(report.get("elapsed_s", 0.0)),
    )


def read_rows(path: Path) -> list[dict[str, Any]]:
    """per_file.csv's rows, the metrics as floats ("nan" as NaN)."""
    return [
        {k: (v if k in ("name", "system") else float(v)) for k, v in row.items()} for row in read_csv(path)
    ]


class EvaluationInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`evaluate`, after the reports of the pairs scored before it were written (none when no
    pair was): ``result`` is what they hold, with ``"interrupted": True``."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__()
        self.result = result


def evaluate(
    model: Enhancer,
    pairs: Sequence[Pair],
    out_dir: str | os.PathLike[str],
    dnsmos: bool | DNSMOS = True,
    limit: int | None = None,
    progress: bool | None = None,
    log: Log | None = _stderr,
    unpaired: Sequence[str] = (),
    settings: dict[str, Any] | None = None,
    resume: Resumed | None = None,
) -> dict[str, Any]:
    """Score ``pairs`` (the first ``limit`` of them) before and after enhancement and write the reports (none when
    no pair could be scored: the folder's earlier reports are kept).

    ``dnsmos`` may be a :class:`DNSMOS` instance to reuse its ONNX session across calls. ``progress`` defaults to
    a tqdm bar when stderr is a terminal, else a ``log`` line every 5 % of the pairs (``False``: neither). Skipped
    files are passed to ``log``. The model is put in eval mode and
    restored to its previous mode afterwards. Returns what ``summary.json`` holds, with NaN instead of null:
    ``{"summary": {"noisy": {...}, "enhanced": {...}}, "skipped": [...], "n_pairs", "n_evaluated", ...}``.
    ``unpaired``: the files the pairing left out (:func:`recipes.pairs.discover_pairs`'s warnings), recorded
    in the reports. ``settings``: what produced the evaluation (model, pairs, limits), recorded in summary.json.
    ``resume``: the reports of an interrupted evaluation of the same pairs (:func:`resumable`); its pairs are
    not scored again.
    """
    selected = list(pairs)[:limit] if limit is not None else list(pairs)
    done = resume.done if resume is not None else set()
    scorer = _scorer(dnsmos)
    show = sys.stderr.isatty() if progress is None else progress
    rows: list[dict[str, Any]] = list(resume.rows) if resume else []
    skipped: list[dict[str, str]] = list(resume.skipped) if resume else []
    mismatched: list[dict[str, str]] = list(resume.mismatched) if resume else []
    failed: list[dict[str, Any]] = list(resume.failed) if resume else []
    computed = METRIC_KEYS if scorer is not None else tuple(k for k in METRIC_KEYS if k not in DNSMOS_KEYS)
    notes = {"resampled": 0, "multichannel": 0, "length_mismatch": 0}
    if resume is not None:
        notes = {k: notes[k] + int(resume.notes.get(k, 0)) for k in notes}
    todo = [pair for pair in selected if pair.name not in done]
    start = time.perf_counter()
    was_training = model.training
    model.eval()
    interrupted = False
    every = max(1, len(todo) // 20)  # without a terminal (a batch job's log): a line every 5 %
    lines = progress is None and not show and log is not None  # (progress=False: neither bar nor lines)
    try:
        for count, pair in enumerate(
            tqdm(todo, desc="evaluate", unit="file", disable=not show, file=sys.stderr)
        ):
            if lines and log is not None and count and count % every == 0:
                per = (time.perf_counter() - start) / count
                log(f"evaluate: {count}/{len(todo)} pairs, {per:.1f} s per pair")
            try:
                scores, file_notes, mismatch, reasons = score_pair(model, pair, scorer)
            except EnhanceError as exc:
                skipped.append({"name": pair.name, "reason": str(exc)})
                if log is not None:
                    log(f"skipped {pair.name}: {exc}")
                continue
            if mismatch:  # scored on the common start, as every pair; it was only counted, without a name
                mismatched.append({"name": pair.name, "reason": mismatch})
                if log is not None:
                    log(f"warning: {pair.name}: {mismatch}; scored on the shorter side's length")
            pair_failed = []  # n_failed counted them without a name or a reason
            for system in SYSTEMS:
                nan = [k for k in computed if not math.isfinite(scores[system][k])]
                if nan:
                    pair_failed.append(
                        {"name": pair.name, "system": system, "metrics": nan, "reason": reasons[system]}
                    )
            # a pair's rows, failures and notes together (a Ctrl-C between them left half a pair)
            # as per_file.csv holds them, which a resumed evaluation reads back: the same means either way
            rows.extend({"name": pair.name, "system": s, **_as_written(scores[s])} for s in SYSTEMS)
            failed.extend(pair_failed)
            notes = {k: notes[k] + file_notes[k] for k in notes}
            if log is not None:
                for f in pair_failed:
                    log(
                        f"warning: {pair.name}: {', '.join(f['metrics'])} of the {f['system']} signal not "
                        f"computed: {f['reason']}"
                    )
    except KeyboardInterrupt:  # the pairs scored so far are reported (after an hour of DNSMOS nothing was)
        interrupted = True
    finally:
        model.train(was_training)
    result: dict[str, Any] = {
        "summary": summarize(rows, computed),
        "n_pairs": len(selected),
        "n_evaluated": len(rows) // len(SYSTEMS),
        "skipped": skipped,
        "unpaired": list(unpaired),
        "length_mismatched": mismatched,
        "failed": failed,
        "interrupted": interrupted,
        "dnsmos": scorer is not None,
        "files_converted": notes,
        "elapsed_s": round(time.perf_counter() - start + (resume.elapsed_s if resume else 0.0), 3),
        "torch_threads": torch.get_num_threads(),  # what elapsed_s was measured with
        "settings": settings or {},
    }
    # nothing scored: the folder's earlier reports stay (they were replaced by empty ones)
    if result["n_evaluated"]:
        try:
            with sigint_deferred():  # the four reports as a set: a Ctrl-C here mixed new files with old ones
                write_outputs(Path(out_dir), rows, result)
        except KeyboardInterrupt:  # delivered once they are written
            raise EvaluationInterrupted(result) from None
    if interrupted:
        raise EvaluationInterrupted(result)
    return result


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tim-evaluate",
        description="Score noisy and enhanced audio of a paired test set (PESQ, STOI, ...).",
    )
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--checkpoint", type=Path, help="trained model checkpoint (.safetensors)")
    model.add_argument(
        "--model-config", metavar="NAME", help="untrained model of this config (for tests only)"
    )
    parser.add_argument(
        "--pairs", type=Path, required=True, help="test-set root (dev, DNS or VoiceBank layout)"
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="output folder for the CSV/Markdown/JSON reports"
    )
    parser.add_argument("--limit", type=positive_int, help="evaluate only the first N pairs (sorted by name)")
    parser.add_argument("--no-dnsmos", action="store_true", help="skip DNSMOS (its columns are left NaN)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on with the interrupted evaluation in --out (same model, pairs and flags): the pairs it scored "
        "are kept, the others scored",
    )
    parser.add_argument("--device", default="cpu", help="torch device for the model (default: cpu)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed for --model-config (default: 0)")
    parser.add_argument(
        "--threads",
        type=positive_int,
        help="CPU threads for the model (default: PyTorch's choice; DNSMOS runs on one)",
    )
    parser.add_argument(
        "--max-attenuation-db",
        type=attenuation_db,
        metavar="DB",
        help="score with this attenuation limit (what recipes.export bundles, e.g. 20; 'inf' = none) instead of "
        "the checkpoint's own (a training run's checkpoints have none)",
    )
    return parser


def load_model(args: argparse.Namespace) -> Enhancer:
    """The model the arguments ask for, on ``args.device`` (raises CheckpointError / KeyError)."""
    device = inference_device(args.device)
    if args.checkpoint is not None:
        model = load_checkpoint(args.checkpoint, map_location=device).model
    else:
        torch.manual_seed(args.seed)
        model = Enhancer(get_config(args.model_config))
    if args.max_attenuation_db is not None:
        model.set_max_attenuation(args.max_attenuation_db)
    return model.to(device).eval()


@on_interrupt("tim-evaluate", "nothing was written")
def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns 0 on success, 1 if no file could be evaluated, 2 on bad input."""
    args = build_parser().parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        problem = out_folder_problem(args.out) or metrics_problem(not args.no_dnsmos)  # before the work
        if problem:
            raise ValueError(problem)
        usable_device(args.device)  # ValueError for cuda without CUDA, as tim-train gives
        found = discover_pairs(args.pairs)
        model = load_model(args)
    except (ValueError, KeyError, CheckpointError, RuntimeError) as exc:
        _stderr(f"error: {exc.args[0] if isinstance(exc, KeyError) else exc}")
        return 2
    except OSError as exc:  # a pairs folder this user cannot read: no traceback
        _stderr(f"error: {exc}")
        return 2
    for warning in found.warnings:
        _stderr(f"warning: {warning}")
    _stderr(f"{found.layout} layout: {len(found.pairs)} pairs under {found.root}")
    try:
        # a result folder says what made it (it gave neither the model nor the pairs)
        settings = {
            "checkpoint": str(Path(args.checkpoint).resolve()) if args.checkpoint else None,
            "checkpoint_sha256": file_sha256(args.checkpoint) if args.checkpoint else None,
            "model_config": args.model_config,
            "seed": None if args.checkpoint else args.seed,
            "pairs": str(Path(found.root).resolve()),
            "layout": found.layout,
            "pairs_found": len(found.pairs),
            "limit": args.limit,
            "max_attenuation_db": model.cfg.max_attenuation_db,
            "device": args.device,
            "command": ["tim-evaluate", *(sys.argv[1:] if argv is None else argv)],
        }
        try:
            resume = (
                resumable(Path(args.out), {**settings, "dnsmos": not args.no_dnsmos}) if args.resume else None
            )
        except ValueError as exc:
            _stderr(f"error: {exc}")
            return 2
        if resume is not None:
            passed = len(resume.done - resume.scored)
            _stderr(
                f"resuming: the {len(resume.scored)} pairs scored before are kept"
                + (f" ({passed} more were skipped: not scored again)" if passed else "")
            )
        result = evaluate(
            model,
            found.pairs,
            args.out,
            dnsmos=not args.no_dnsmos,
            limit=args.limit,
            unpaired=found.warnings,
            settings=settings,
            resume=resume,
        )
    except EvaluationInterrupted as stop:
        done = stop.result["n_evaluated"]
        kept = (
            f"{args.out} holds the reports of the {done} of {stop.result['n_pairs']} pairs scored before it; "
            "the same command with --resume goes on"
            if done
            else "nothing was written (no pair was scored yet)"
        )
        print(f"tim-evaluate: interrupted; {kept}", file=sys.stderr)
        return 130
    except OSError as exc:  # the tables could not be written (a full disk): say so in one line
        _stderr(f"error: {exc}")
        return 1
    if result["n_evaluated"] == 0:
        _stderr(f"error: no file could be evaluated; nothing written to {args.out}")
        return 1
    print(markdown_table(result["summary"]) + left_out(result), end="")
    _stderr(f"wrote {args.out}/per_file.csv, summary.csv, summary.md, summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
