"""OpenMP's waiting policy and a busy machine: ``enhance-cli`` on a 60-s file, with OpenMP's own default (idle
threads spin a while before they sleep) and with ``OMP_WAIT_POLICY=PASSIVE`` (they sleep at once; what the
commands set unless the user set it, enhance/wait_policy.py), on an idle machine and with one busy process per
core beside it (a Python loop each, like other users' jobs).

    python bench/bench_wait_policy.py [--model default | --checkpoint PATH] [--seconds 60] [--repeats 3]

Each case runs ``--repeats`` times, the policies alternating; reported: the median real-time factor of the
enhancement itself (the CLI's --json timing, model loading excluded), with the CLI's default threads (PyTorch's
choice: one per core) and with ``--threads 1``. OpenMP's default is had by setting ``OMP_WAIT_POLICY`` to an empty
value, which the runtime ignores and the commands keep. Prints a Markdown table and writes it to
``bench/results/wait-policy.md`` (``--out`` another file for trial runs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_offline import ROOT, make_file, run_cli
from machine import command_line, cpu_summary  # bench/machine.py (bench/ is on sys.path when run as a script)
from model_arg import add_model_args, model_cli_args
from sigterm import exit_on_sigterm

sys.path.insert(0, str(ROOT))
from recipes.run_folder import write_text  # (after the path: the repository root, when run as a script)

# OMP_WAIT_POLICY per column: an empty value is ignored by the runtime (its own default) and kept by the commands
DEFAULT, PASSIVE = "", "PASSIVE"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--seconds", type=float, default=60.0, help="audio per run (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per case, policies alternating (default 3)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "wait-policy.md")
    args = ap.parse_args()
    exit_on_sigterm()  # the CPU hogs are stopped (they spun for good after a kill)
    model_args = model_cli_args(args)
    cores = os.cpu_count() or 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.wav", Path(tmp) / "out.wav"
        make_file(src, args.seconds)
        for load in ("idle", "busy"):
            hogs = []
            if load == "busy":  # one spinning process per core, started before and stopped after the runs
                hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
            try:
                for threads in (None, 1):
                    times: dict[str, list[float]] = {DEFAULT: [], PASSIVE: []}
                    for _ in range(max(1, args.repeats)):
                        for policy, runs in times.items():
                            summary, _, _ = run_cli(
                                [str(src), "-o", str(dst), *model_args], threads, {"OMP_WAIT_POLICY": policy}
                            )
                            runs.append(float(summary["files"][0]["real_time_factor"]))
                    default, passive = (statistics.median(times[p]) for p in (DEFAULT, PASSIVE))
                    machine = "idle" if load == "idle" else f"{cores} busy processes"
                    rows.append(
                        f"| {machine} | {threads or 'default'} | {default:.4f} | {passive:.4f} "
                        f"| {passive / default:.2f} |"
                    )
            except RuntimeError as exc:
                print(f"error: {str(exc).strip()}", file=sys.stderr)
                return 2
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()
    text = (
        f"OpenMP waiting policy, enhance-cli on a {args.seconds:g}-s file, {cpu_summary()}. "
        f"Command: `{command_line()}`\n\n"
        f"Median real-time factor of {args.repeats} runs per case (the enhancement itself; policies alternating).\n\n"
        "| machine | --threads | OpenMP's default | PASSIVE | PASSIVE / default |\n|---|---|---|---|---|\n"
        + "\n".join(rows)
        + "\n"
    )
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
