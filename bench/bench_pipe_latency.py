"""How much audio the raw PCM pipe (``enhance-cli --stream - -o -``) holds back, per sample rate and resampler.

    python bench/bench_pipe_latency.py --out bench/results/pipe-latency.md

Feeds f32le noise in 10-ms writes to the real CLI (a subprocess, one thread) and, after each write, reads what has
come out until nothing more arrives for ``--quiet`` seconds; "held back" is samples written in minus samples read
out at that moment, over the run's writes after the first 100 ms (start-up). At 16 kHz it is the engine's own
hold (up to 48 ms, one hop of input plus the window and lookahead); at other rates soxr's two resamplers add
theirs, less with ``--resampling low_latency`` (LQ) than with the default HQ. The figures include the wait for
output (``--quiet``), so they are upper bounds of the algorithmic hold, not of a loaded machine's.
"""

from __future__ import annotations

import argparse
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from machine import command_line, cpu_summary  # bench/machine.py (bench/ is on sys.path when run as a script)
from model_arg import add_model_args, model_cli_args, model_label

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from recipes.run_folder import write_text  # noqa: E402 (after the path: the repository root)


def held_back(rate: int, resampling: str, seconds: float, quiet: float, model: list[str]) -> np.ndarray:
    """Samples held back after each 10-ms write (from the 10th write after output begins)."""
    chunk = max(1, rate // 100)
    n = int(rate * seconds)
    data = (np.random.default_rng(0).standard_normal(n) * 0.003).astype("<f4").tobytes()
    cmd = [
        sys.executable,
        "-m",
        "enhance.cli",
        "--stream",
        "-",
        "-o",
        "-",
        "--pcm",
        "f32le",
        "--rate",
        str(rate),
    ]
    cmd += ["--threads", "1", *model] + (["--resampling", resampling] if rate != 16000 else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdin is not None and proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    got, lags = 0, []
    for i in range(0, n, chunk):
        proc.stdin.write(data[i * 4 : (i + chunk) * 4])
        proc.stdin.flush()
        until = time.monotonic() + quiet
        while time.monotonic() < until:
            if select.select([proc.stdout], [], [], 0.01)[0]:
                out = proc.stdout.read(1 << 16)
                if out:
                    got += len(out)
                    until = time.monotonic() + quiet
        lags.append(min(i + chunk, n) - got // 4)
    proc.stdin.close()
    os.set_blocking(proc.stdout.fileno(), True)
    got += len(proc.stdout.read())
    if proc.wait() != 0 or got // 4 != n:
        raise RuntimeError(f"{rate} Hz: the pipe gave {got // 4} of {n} samples: {proc.stderr.read()!r}")
    # from the 10th write after the first output: before it, the CLI was still starting (its start-up, not the
    # pipe's hold, filled the max and mean columns where start-up outlasts 10 quiet periods)
    first = next((k for k, lag in enumerate(lags) if lag < min((k + 1) * chunk, n)), len(lags))
    return np.array(lags[first + 10 :])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="16000,8000,44100,48000,96000")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--quiet", type=float, default=0.1, help="seconds without output that end a read")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "pipe-latency.md")
    add_model_args(p)
    args = p.parse_args(argv)
    rows = []
    for rate in (int(r) for r in args.rates.split(",")):
        for resampling in ("high", "low_latency") if rate != 16000 else ("-",):
            lag = 1000.0 * held_back(rate, resampling, args.seconds, args.quiet, model_cli_args(args)) / rate
            rows.append(
                f"| {rate} | {resampling} | {lag.mean():.1f} | {np.median(lag):.1f} | {lag.max():.1f} |"
            )
            print(rows[-1], flush=True)
    text = (
        f"# Raw PCM pipe: audio held back\n\n{time.strftime('%Y-%m-%d')}, model {model_label(args)}, {cpu_summary()}. "
        f"Command: `{command_line()}`\n\n"
        "| rate (Hz) | --resampling | mean (ms) | median (ms) | max (ms) |\n|---|---|---|---|---|\n"
        + "\n".join(rows)
        + "\n"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text(args.out, text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
