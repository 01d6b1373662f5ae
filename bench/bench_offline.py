"""Offline enhancement benchmark (issue 4): real-time factor on one CPU thread and peak memory.

    python bench/bench_offline.py [--checkpoint PATH | --model default] [--minutes 60] [--device cpu]

* RTF: ``enhance-cli`` on a 60-s 16 kHz file, wall time of the enhancement itself (the CLI's --json timing, model
  loading excluded), median of 3 runs, 1 thread.
* 48 kHz: the same on a 60-s 48 kHz file, with the band above 8 kHz gated (``--high-band gate``, the default)
  and dropped, runs alternating; the ratio is the median of the per-round ratios.
* Peak memory: maximum resident set size of an ``enhance-cli`` process enhancing a ``--minutes``-long file
  (default 60 min), read from the kernel (``getrusage`` of the child), model loading included.

The audio is generated (harmonic speech-like signal + noise); the speed does not depend on the content. Prints a
Markdown table and writes it to ``bench/results/offline-<device>.md`` (``--out`` another file for trial runs).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf
from machine import command_line, cpu_summary  # bench/machine.py (bench/ is on sys.path when run as a script)
from model_arg import add_model_args, model_cli_args
from sigterm import exit_on_sigterm

ROOT = Path(__file__).resolve().parents[1]


def make_file(path: Path, seconds: float, rate: int = 16000) -> None:
    """Write ``seconds`` of noisy speech-like audio in 60-s blocks (bounded memory)."""
    rng = np.random.default_rng(0)
    with sf.SoundFile(path, "w", rate, 1, "PCM_16") as f:
        left = int(seconds * rate)
        while left > 0:
            n = min(left, 60 * rate)
            t = np.arange(n) / rate
            voiced = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 10))
            env = np.clip(np.sin(2 * np.pi * 3 * t), 0, None) ** 2
            f.write((0.05 * voiced * env + 0.01 * rng.standard_normal(n)).astype(np.float32))
            left -= n


def run_cli(
    args: list[str], threads: int | None, env_extra: dict[str, str] | None = None
) -> tuple[dict, float, int]:
    """Run enhance-cli; returns (its --json summary, wall seconds, peak RSS of the child in bytes). ``threads``
    None: the CLI's default (PyTorch's choice; OMP_NUM_THREADS left out). ``env_extra``: more environment."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(PYTHONPATH=str(ROOT), **(env_extra or {}))
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "enhance.cli",
            *args,
            "--json",
            "--quiet",
            "--overwrite",
            *(["--threads", str(threads)] if threads is not None else []),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if peak_kb <= before:
        peak_kb = -1  # a previous child was bigger; getrusage keeps the maximum over all children
    return json.loads(proc.stdout), wall, peak_kb * 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, help="the table's file (default: bench/results/offline-<device>.md)")
    args = ap.parse_args()
    if args.repeats < 1:  # it failed with a traceback, after minutes of the long-file run
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.minutes <= 0:
        ap.error(f"--minutes must be positive, got {args.minutes:g}")
    exit_on_sigterm()  # the CLI run it waits for is killed, its temporary files removed
    try:
        return run(args)
    except RuntimeError as exc:  # enhance-cli's own message (a missing checkpoint, a bad device)
        print(f"error: {str(exc).strip()}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    model_args = [*model_cli_args(args), "--device", args.device]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # the memory run first: getrusage(RUSAGE_CHILDREN) reports the largest child so far
        long_in, long_out = Path(tmp) / "long.wav", Path(tmp) / "long_out.wav"
        make_file(long_in, args.minutes * 60)
        summary, wall, peak = run_cli([str(long_in), "-o", str(long_out), *model_args], threads=1)
        f = summary["files"][0]
        rows.append(
            (
                f"{args.minutes:g}-min file, 1 thread",
                f"{f['real_time_factor']:.4f}",
                f"{peak / 2**20:.0f} MiB",
                f"{wall:.0f} s",
            )
        )
        long_in.unlink()
        long_out.unlink()
        short_in, short_out = Path(tmp) / "60s.wav", Path(tmp) / "60s_out.wav"
        make_file(short_in, 60)
        for threads in (1, os.cpu_count() or 1):
            rtfs = []
            for _ in range(args.repeats):
                summary, wall, _ = run_cli(
                    [str(short_in), "-o", str(short_out), *model_args], threads=threads
                )
                rtfs.append(summary["files"][0]["real_time_factor"])
            rows.append(
                (
                    f"60-s file, {threads} thread(s)",
                    f"{statistics.median(rtfs):.4f}",
                    "",
                    f"median of {len(rtfs)}",
                )
            )
            if threads == 1 and (os.cpu_count() or 1) == 1:
                break
        # 48 kHz: the band above 8 kHz gated (the default) against dropped, alternating, one thread
        short_in.unlink()
        make_file(short_in, 60, rate=48000)
        by_mode: dict[str, list[float]] = {"gate": [], "drop": []}
        for _ in range(args.repeats):
            for mode in by_mode:
                summary, _, _ = run_cli(
                    [str(short_in), "-o", str(short_out), *model_args, "--high-band", mode], threads=1
                )
                by_mode[mode].append(summary["files"][0]["real_time_factor"])
        ratio = statistics.median(g / d for g, d in zip(by_mode["gate"], by_mode["drop"], strict=True))
        for mode, rtfs in by_mode.items():
            note = f"median of {len(rtfs)}" + (
                f"; {ratio:.2f}x drop's time (median per round)" if mode == "gate" else ""
            )
            rows.append(
                (
                    f"60-s 48 kHz file, 1 thread, --high-band {mode}",
                    f"{statistics.median(rtfs):.4f}",
                    "",
                    note,
                )
            )
    model = args.checkpoint or args.model
    header = (
        f"Offline enhancement, model `{model}`, device {args.device}, {cpu_summary()}, "
        f"{time.strftime('%Y-%m-%d')}. Command: `{command_line()}`\n\n"
        "Targets: real-time factor <= 0.03 (60-s file, 1 thread); peak memory <= 1 GB (60-min file).\n"
    )
    table = "| case | real-time factor | peak RSS | note |\n|---|---|---|---|\n" + "\n".join(
        f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows
    )
    text = header + "\n" + table + "\n"
    print(text)
    out = args.out or ROOT / "bench" / "results" / f"offline-{args.device.replace(':', '')}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")  # a stopped run leaves the old table whole
    tmp.write_text(text)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
