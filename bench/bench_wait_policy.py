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
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_offline import make_file
from machine import command_line, cpu_summary  # bench/machine.py (bench/ is on sys.path when run as a script)

ROOT = Path(__file__).resolve().parents[1]
POLICIES = {"OpenMP's default": "", "PASSIVE": "PASSIVE"}


def rtf(src: Path, dst: Path, model_args: list[str], policy: str, threads: int | None) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(OMP_WAIT_POLICY=policy, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "enhance.cli", str(src), "-o", str(dst), *model_args]
    cmd += ["--json", "--quiet", "--overwrite", *(["--threads", str(threads)] if threads else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    return float(json.loads(proc.stdout)["files"][0]["real_time_factor"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--checkpoint")
    g.add_argument("--model", default="default")
    ap.add_argument("--seconds", type=float, default=60.0, help="audio per run (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per case, policies alternating (default 3)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "wait-policy.md")
    args = ap.parse_args()
    model_args = ["--checkpoint", args.checkpoint] if args.checkpoint else ["--model", args.model]
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
                    times: dict[str, list[float]] = {name: [] for name in POLICIES}
                    for _ in range(max(1, args.repeats)):
                        for name, policy in POLICIES.items():
                            times[name].append(rtf(src, dst, model_args, policy, threads))
                    med = {name: statistics.median(ts) for name, ts in times.items()}
                    rows.append(
                        f"| {'idle' if load == 'idle' else f'{cores} busy processes'} "
                        f"| {threads or 'default'} | {med[next(iter(POLICIES))]:.4f} | {med['PASSIVE']:.4f} "
                        f"| {med['PASSIVE'] / med[next(iter(POLICIES))]:.2f} |"
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
    tmp_out = args.out.with_name(f".{args.out.name}.tmp")
    tmp_out.write_text(text)
    os.replace(tmp_out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
