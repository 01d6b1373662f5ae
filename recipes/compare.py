"""Train several model configs the same way, evaluate each, and tabulate: the paper's comparison and the ablations.

    python -m recipes.compare --out runs/compare --configs transformer tim-nocomp tim tim4 \\
        --config recipes/configs/shared.json --epochs 3 --steps-per-epoch 30 --threads 1

Every config gets the same data config, seed, epochs, steps and batch size (one run folder each under ``--out``);
a run that is already complete is kept, a killed one is resumed (``--resume``), so the command can simply be run
again. Each run's best checkpoint is then evaluated on ``--pairs`` (PESQ, STOI, SI-SDR; DNSMOS with ``--dnsmos``).
Writes ``--out``/comparison.md (the table, with the noisy input row) and comparison.png (validation loss per epoch,
the convergence curves) if matplotlib is installed.

``--round-epochs K`` trains the configs in turn, K epochs at a time, and tabulates after each round, so a comparison
stopped by a time limit leaves a table of runs trained equally long; without it, each config runs to ``--epochs``
before the next one starts.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from enhance.atomic_files import atomic_path
from models.registry import REGISTRY
from recipes.datasets import DataConfig
from recipes.evaluate import positive_int
from recipes.interrupt import on_interrupt
from recipes.run_folder import out_folder_problem, read_csv, trained_files
from recipes.train import merge, read_config
from recipes.trainer import LEGACY_DATA

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str]) -> None:
    """A recipe command in a child process, in this process' folder (relative paths mean what the user meant),
    finding this checkout's packages whether or not they are installed."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": path})


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tim-compare", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--configs",
        nargs="+",
        required=True,
        choices=sorted(REGISTRY),
        metavar="NAME",
        help=f"model configs to compare, by name (not files; those are --config): {', '.join(sorted(REGISTRY))}",
    )
    p.add_argument("--out", type=Path, required=True, help="folder for one run folder per config")
    p.add_argument("--config", action="append", default=[], help="data/train JSON shared by all runs")
    p.add_argument(
        "--pairs", default=None, help="paired dev/test set to evaluate on (default: the data config's)"
    )
    p.add_argument("--epochs", type=int, required=True, help="epochs each config is trained")
    p.add_argument(
        "--round-epochs",
        type=int,
        default=None,
        metavar="K",
        help="train the configs in turn, K epochs at a time, and tabulate after each round",
    )
    p.add_argument(
        "--steps-per-epoch", type=positive_int, default=None, help="cap steps per epoch (default: all)"
    )
    p.add_argument("--seed", type=int, default=0, help="the same for every run (default 0)")
    # 0 was taken as "not given"
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads of each run")
    p.add_argument("--dnsmos", action="store_true", help="also score DNSMOS (slower)")
    p.add_argument("--skip-training", action="store_true", help="only evaluate and tabulate existing runs")
    return p


def _epochs_done(run: Path) -> int:
    return len(val_curve(run)) if (run / "metrics.csv").is_file() else 0


def train(name: str, run: Path, epochs: int, args: argparse.Namespace) -> None:
    done = _epochs_done(run)
    if done >= epochs:
        more = f" ({done} trained: the table shows those)" if done > epochs else ""
        print(f"[compare] {name}: {epochs} epochs already done{more}", flush=True)
        return
    cmd = [sys.executable, "-m", "recipes.train", "--out", str(run)]
    if (run / "state.pt").is_file():  # a killed run, or a finished one extended to more epochs
        cmd += ["--resume", "--epochs", str(epochs)]
    else:
        for c in args.config:
            cmd += ["--config", c]
        cmd += ["--model", name, "--epochs", str(epochs), "--seed", str(args.seed)]
        if args.steps_per_epoch:
            cmd += ["--max-steps-per-epoch", str(args.steps_per_epoch)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    print(f"[compare] {name}: {' '.join(cmd[1:])}", flush=True)
    _run(cmd)


def check_settings(args: argparse.Namespace) -> None:
    """Every run under ``--out`` is trained the same way: refuse to continue a comparison with other settings
    (only ``--epochs`` may grow, which extends every run)."""
    configs = [read_config(c) for c in args.config]  # a list or a folder was a traceback
    merged: dict[str, Any] = functools.reduce(merge, configs, {})
    if not isinstance(merged.get("data", {}), dict):
        raise ValueError(f"config.data: expected an object, got {merged['data']!r}")
    settings = {
        "configs": configs,
        "steps_per_epoch": args.steps_per_epoch,
        "seed": args.seed,
        # what new runs get (DataConfig.dc_blocker); runs of a comparison started before the setting (session 26)
        # resume without it, so one table must not mix the two
        "dc_blocker": bool(merged.get("data", {}).get("dc_blocker", DataConfig().dc_blocker)),
        # likewise DataConfig.val_spread (session 36: which files validate when there are no val_pairs)
        "val_spread": bool(merged.get("data", {}).get("val_spread", DataConfig().val_spread)),
    }
    path = args.out / "settings.json"
    if path.is_file():
        # its "dc_blocker" key: only since session 26, "val_spread" since session 36
        legacy = {k: LEGACY_DATA[k] for k in ("dc_blocker", "val_spread")}
        saved = {**legacy, **json.loads(path.read_text())}
        trained = any(trained_files(d) for d in args.out.iterdir() if d.is_dir())
        # the settings.json of an attempt that trained nothing (a typo in a path) is replaced below
        if saved != settings and trained:
            before = (
                " (its runs were trained without the DC blocker)"
                if saved["dc_blocker"] != settings["dc_blocker"]
                else ""
            )
            raise ValueError(
                f"{args.out} holds runs trained with other settings{before} (see {path}); use a new --out to "
                "compare those"
            )
        if saved == settings:
            return
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(settings, indent=2) + "\n")


def evaluate(name: str, run: Path, pairs: str, dnsmos: bool) -> Path:
    """The run's best checkpoint evaluated on ``pairs`` (again only when the checkpoint or the settings changed);
    returns its ``per_file.csv``."""
    out = run / "eval"
    summary, best, used = out / "summary.json", run / "best.safetensors", out / "settings.json"
    settings = {"pairs": str(pairs), "dnsmos": dnsmos}
    stale = (
        not summary.is_file()
        or summary.stat().st_mtime_ns < best.stat().st_mtime_ns  # the best checkpoint changed
        or not used.is_file()
        or json.loads(used.read_text()) != settings  # other pairs, or DNSMOS switched
    )
    if stale:
        cmd = [sys.executable, "-m", "recipes.evaluate", "--checkpoint", str(run / "best.safetensors")]
        cmd += ["--pairs", pairs, "--out", str(out)] + ([] if dnsmos else ["--no-dnsmos"])
        print(f"[compare] {name}: evaluating on {pairs}", flush=True)
        # a failed evaluation must not leave the folder looking fresh for these settings
        used.unlink(missing_ok=True)
        _run(cmd)
        with atomic_path(used) as tmp:
            Path(tmp).write_text(json.dumps(settings) + "\n")
    return out / "per_file.csv"


def val_curve(run: Path) -> list[float]:
    with (run / "metrics.csv").open() as f:
        return [float(row["val_loss"]) for row in csv.DictReader(f)]


def _fmt(value: float | None, digits: int) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def joint_summary(per_file: dict[str, Path], dnsmos: bool) -> dict[str, dict[str, float]]:
    """The table's means, over the same files for every row: each run's ``per_file.csv`` (its enhanced rows under
    the run's name, the noisy rows from the first run) through :func:`recipes.evaluate.summarize`. Each run's own
    summary is a mean over the files where *its* metrics were finite, so a model whose output made PESQ fail on
    one file was averaged over fewer files than the others."""
    from recipes.evaluate import DNSMOS_KEYS, METRIC_KEYS, summarize

    rows: list[dict[str, str]] = []
    for i, (name, path) in enumerate(per_file.items()):
        for row in read_csv(path):
            if row["system"] == "enhanced":
                rows.append({**row, "system": name})
            elif i == 0:
                rows.append(row)
    computed = METRIC_KEYS if dnsmos else tuple(k for k in METRIC_KEYS if k not in DNSMOS_KEYS)
    return summarize(rows, computed, systems=["noisy", *per_file])


def table(rows: list[tuple[str, list[float], Path]], dnsmos: bool) -> str:
    """``rows``: (name, validation curve, per-file scores) per run."""
    joint = joint_summary({name: per_file for name, _, per_file in rows}, dnsmos)
    metrics = [("pesq", 3), ("stoi", 3), ("si_sdr", 2)] + ([("dnsmos_ovrl", 3)] if dnsmos else [])
    head = ["system", "val loss by epoch", "best val loss", *(m for m, _ in metrics), "files"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    noisy = joint.get("noisy") if rows else None
    if noisy is not None:
        vals = [_fmt(noisy.get(m), d) for m, d in metrics]
        lines.append("| noisy input | – | – | " + " | ".join(vals) + f" | {int(noisy['n_files'])} |")
    for name, curve, _ in rows:
        enh = joint[name]
        vals = [_fmt(enh.get(m), d) for m, d in metrics]
        lines.append(
            f"| `{name}` | {', '.join(f'{v:.4f}' for v in curve)} | {min(curve):.4f} | "
            + " | ".join(vals)
            + f" | {int(enh['n_files'])} |"
        )
    epochs = {name: len(curve) for name, curve, _ in rows}
    if len(set(epochs.values())) > 1:  # an earlier call trained some runs longer: not a like-for-like table
        done = ", ".join(f"`{n}` {e}" for n, e in epochs.items())
        lines.append(f"\n**Warning: the runs were trained for different numbers of epochs ({done}).**")
    return "\n".join(lines) + "\n"


def plot(rows: list[tuple[str, list[float], Path]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, curve, _ in rows:
        ax.plot(range(1, len(curve) + 1), curve, marker="o", label=name)
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation loss (log1p-magnitude MSE)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return True


def check_pairs(args: argparse.Namespace) -> None:
    """Something to evaluate on, before any training: it was found after the first config had trained in full
    (hours at the paper's size). The DNS and VoiceBank recipes validate on held-out mixes, not on pairs, so
    their test set must be named."""
    if args.skip_training or args.pairs:
        return
    merged: dict[str, Any] = functools.reduce(merge, [read_config(c) for c in args.config], {})
    if not merged.get("data", {}).get("val_pairs"):
        raise ValueError(
            "nothing to evaluate the runs on: give --pairs (e.g. DNS's test_set/synthetic/no_reverb or "
            "VoiceBank's testset folders), or data.val_pairs in --config"
        )


def rounds(epochs: int, round_epochs: int | None) -> list[int]:
    """The epoch counts every config is brought to in turn: [epochs], or K, 2K, ... up to epochs."""
    if not round_epochs or round_epochs >= epochs:
        return [epochs]
    return [*range(round_epochs, epochs, round_epochs), epochs]


def run_round(args: argparse.Namespace, epochs: int) -> None:
    """Train every config to ``epochs`` (unless ``--skip-training``), evaluate, and write the table."""
    rows = []
    for name in args.configs:
        run = args.out / name
        try:
            if not args.skip_training:
                train(name, run, epochs, args)
            if not (run / "config.json").is_file():
                raise ValueError(f"no run in {run} (--skip-training evaluates runs trained before)")
            saved = json.loads((run / "config.json").read_text())
            pairs = args.pairs or saved["data"].get("val_pairs")
            if not pairs:
                raise ValueError("no --pairs and the run has no val_pairs to evaluate on")
            rows.append((name, val_curve(run), evaluate(name, run, pairs, args.dnsmos)))
        except (subprocess.CalledProcessError, FileNotFoundError, ValueError) as exc:
            raise ValueError(f"{name}: {exc}") from exc
    text = table(rows, args.dnsmos)
    with atomic_path(args.out / "comparison.md") as tmp:
        Path(tmp).write_text(text)
    drawn = plot(rows, args.out / "comparison.png")
    print(text)
    print(f"wrote {args.out}/comparison.md" + (" and comparison.png" if drawn else ""), flush=True)


@on_interrupt(
    "tim-compare",
    "finished runs are kept and the same command continues the comparison (a killed run resumes)",
)
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.epochs < 1 or (args.round_epochs is not None and args.round_epochs < 1):
        print("tim-compare: error: --epochs and --round-epochs must be at least 1", file=sys.stderr)
        return 2
    problem = out_folder_problem(args.out)
    if problem:
        print(f"tim-compare: error: {problem}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        check_settings(args)
        check_pairs(args)
    except (OSError, ValueError) as exc:
        print(f"tim-compare: error: {exc}", file=sys.stderr)
        return 1
    for epochs in rounds(args.epochs, None if args.skip_training else args.round_epochs):
        try:
            run_round(args, epochs)
        except ValueError as exc:
            print(f"tim-compare: error: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
