"""Ctrl-C and SIGTERM at random moments while enhance-cli enhances a long FLAC read from stdin (decoded through
libsndfile's cffi callbacks, where a signal's exception used to be dropped: exit 0 and a full output).

    python bench/results/stop-signals/check.py [RUNS]    # from the repository root; default 12 per signal

Each run must exit 130 (SIGINT) or 143 (SIGTERM) with no output file. Prints one line per run and writes the
summary to check.txt beside this file.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    rng = np.random.default_rng(0)
    random.seed(0)
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "long.flac", Path(tmp) / "out.flac"
        sf.write(
            src, (0.05 * rng.standard_normal((240 * 48000, 2))).astype(np.float32), 48000
        )  # 4 min stereo
        for sig, want in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
            bad = 0
            for _ in range(runs):
                dst.unlink(missing_ok=True)
                delay = random.uniform(2.5, 9.0)
                with src.open("rb") as stdin:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "enhance.cli", "-", "-o", str(dst), "-q"],
                        stdin=stdin,
                        stderr=subprocess.DEVNULL,
                        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal
                    )
                    time.sleep(delay)
                    alive = proc.poll() is None
                    proc.send_signal(sig)
                    proc.wait(timeout=120)
                clean = proc.returncode == want and not dst.exists()
                bad += alive and not clean
                print(
                    f"{sig.name} after {delay:.2f} s: exit {proc.returncode}, output left {dst.exists()}",
                    flush=True,
                )
            lines.append(f"{sig.name}: {bad} of {runs} runs not stopped cleanly (exit {want}, no output)")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    (Path(__file__).resolve().parent / "check.txt").write_text(text)


if __name__ == "__main__":
    main()
