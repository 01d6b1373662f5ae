"""A reduced-precision streaming backend against its float32 one: how much faster, how close.

    python bench/bench_int8.py [--backend onnxruntime-int8 | native-int8 | native-fp16 | torchscript-int8]
        [--model default | --checkpoint PATH] [--pairs ../shared/data] [--limit 120] [--no-dnsmos]
        [--out bench/results/int8 (onnxruntime-int8) | bench/results/<backend>]

``onnxruntime-int8`` (the default) is compared with ``onnxruntime``; ``native-int8`` and ``native-fp16`` (the C
step with int8 / float16 weight matrices and float16 key/value rings, ``enhance/native_backend.py``) with
``native``, the C step in float32; ``torchscript-int8`` (the traced step with the pre-encoder's products in int8,
``enhance/torch_int8.py``) with ``torchscript``. What follows is written for the onnxruntime pair; the native and
TorchScript pairs time their step alone at 1 and 2 frames per call (no free-frame-count export there) and the same
engine rows.

A per-hop stream reads every weight of the model once per 16 ms hop: 23 MB in float32 for the default model, which
sets a floor under the real-time factor (``bench/bench_step_floor.py``). ``enhance.onnx_backend.quantize_step``
stores the weights in 8 bits (per block of 32, with their scales), about a quarter of the bytes. This measures, in
one process on one CPU thread:

* **speed** of the ``onnxruntime`` and ``onnxruntime-int8`` backends as ``enhance.backends`` builds them (a
  one-frame step for per-hop calls beside the free one): the step alone (ms per call, 1 and 2 new frames, and
  1 frame through the free-frame-count step, to show what the one-frame export saves; fastest of 5 batches of
  ``--calls`` calls) and the whole streaming engine fed 16 ms and 32 ms chunks of a
  10-s test signal (real-time factor; fastest of 3 passes); float32 and int8 timed alternately, so that load
  from other processes hits both alike;
* **accuracy**: each pair of ``--pairs`` (any layout of ``recipes.pairs``; default: the example file) enhanced by
  the engine with each backend, fed one 16-ms hop at a time as a live stream is, scored against the clean file (PESQ-wb, STOI, SI-SDR, DNSMOS unless
  ``--no-dnsmos``), with the paired difference int8 − float32 and its 95 % bootstrap interval
  (``bench_paired.paired``), and the signal-to-difference ratio of the int8 output to the float32 output.

Writes ``summary.md``, ``speed.csv``, ``paired.csv`` and ``per_file.csv`` to ``--out`` (atomically) and prints
the Markdown.
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"  # one thread, set before numpy, torch and onnxruntime are imported

import argparse
import functools
import math
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ (not a package)
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository root

import bench_paired
import numpy as np
import torch
from bench_chunk_sizes import fastest_alternating, rtf
from bench_streaming import test_signal
from machine import cpu_summary  # bench/machine.py (bench/ is on sys.path when run as a script)
from model_arg import add_model_args, load_model, model_label

from enhance.audio_io import load_mono_16k
from enhance.fixed_step import TracedStepper
from enhance.native_backend import NativeStepper
from enhance.onnx_backend import OnnxStepper, onnx_stepper
from enhance.streaming import StreamingEnhancer
from models.enhancer import Enhancer
from recipes.evaluate import write_csv
from recipes.metrics import DNSMOS, METRIC_KEYS, compute_metrics
from recipes.pairs import Pair, discover_pairs
from recipes.run_folder import write_text

ROOT = Path(__file__).resolve().parents[1]
REDUCED = {
    "onnxruntime-int8": "int8",
    "native-int8": "int8",
    "native-fp16": "float16",
    "torchscript-int8": "int8",
}


def step_timer(
    stepper: OnnxStepper | TracedStepper, frames: int, calls: int, free: bool = False
) -> Callable[[], float]:
    """Seconds per call of the exported or traced step with ``frames`` new frames (a full ring; zeros): as the
    stepper dispatches it (onnxruntime, 1 frame: the one-frame step), or with ``free`` always the exported step
    with a free frame count."""
    state = stepper.new_state(1).channels[0]
    feed = {
        "feat": torch.zeros(1, frames, stepper.n_bins),
        "mask": torch.zeros(frames, stepper.context + frames),
    }
    feed |= state
    arrays = {name: t.numpy() for name, t in feed.items()}

    def run() -> object:
        if free:
            assert isinstance(stepper, OnnxStepper)
            return stepper.session.run(None, arrays)
        return stepper.run(feed)

    for _ in range(10):
        run()

    def batch() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            run()
        return (time.perf_counter() - t0) / calls

    return batch


def native_step_timer(stepper: NativeStepper, frames: int, calls: int) -> Callable[[], float]:
    """Seconds per call of the C step with ``frames`` new frames, after a full ring of frames (zeros)."""
    state = stepper.new_state(1)
    feats = torch.zeros(1, frames, stepper.n_bins)
    for _ in range(stepper.model.cfg.context_frames // frames + 2):
        stepper.step(feats, state)

    def batch() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            stepper.step(feats, state)
        return (time.perf_counter() - t0) / calls

    return batch


def enhance(engine: StreamingEnhancer, noisy: np.ndarray, chunk: int = 256) -> np.ndarray:
    """``noisy`` through ``engine`` one 16-ms hop at a time, like a live stream (and ``enhance-cli --stream``):
    the int8 output depends a little on the frames per call (bench/results/int8-blockwise/frames_per_call.md)."""
    engine.reset()
    outs = [engine.process(noisy[None, i : i + chunk]) for i in range(0, len(noisy), chunk)]
    return np.concatenate([*outs, engine.flush()], axis=1)[0]


def example_pairs() -> list[Pair]:
    return [Pair("example", ROOT / "examples" / "noisy.wav", ROOT / "examples" / "clean.wav")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--backend", choices=sorted(REDUCED), default="onnxruntime-int8")
    ap.add_argument("--pairs", help="folder of noisy/clean pairs (default: examples/noisy.wav and clean.wav)")
    ap.add_argument("--limit", type=int, default=120, help="score at most this many pairs")
    ap.add_argument("--no-dnsmos", action="store_true")
    ap.add_argument("--calls", type=int, default=200, help="step calls per timed batch")
    ap.add_argument("--seconds", type=float, default=10.0, help="test signal for the engine's speed")
    ap.add_argument("--out", help="results folder (default: bench/results/int8 or bench/results/<backend>)")
    args = ap.parse_args(argv)
    reduced = REDUCED[args.backend]
    kinds = ("float32", reduced)
    native = args.backend.startswith("native")
    traced = args.backend.startswith("torchscript")
    default_out = "int8" if args.backend == "onnxruntime-int8" else args.backend
    out = Path(args.out or ROOT / "bench" / "results" / default_out)
    torch.set_num_threads(1)
    ck = load_model(args)
    model: Enhancer = ck.model.float().eval()
    if args.pairs:
        try:
            pairs = discover_pairs(args.pairs).pairs[: args.limit]
        except ValueError as exc:
            print(f"bench_int8: {exc}", file=sys.stderr)
            return 2
    else:
        pairs = example_pairs()
    load_before = os.getloadavg()[0]
    # what the backends run (onnxruntime: a one-frame step for per-hop calls, and the free one)
    steppers: dict[str, Any]
    if native:
        steppers = {kind: NativeStepper(model, weights=kind) for kind in kinds}
        rows = [("step alone, 1 frame per call", 1, False), ("step alone, 2 frames per call", 2, False)]
    elif traced:
        steppers = {kind: TracedStepper(model, int8=kind == "int8") for kind in kinds}
        rows = [("step alone, 1 frame per call", 1, False), ("step alone, 2 frames per call", 2, False)]
    else:
        steppers = {kind: onnx_stepper(model, int8=kind == "int8") for kind in kinds}
        rows = [
            ("step alone, 1 frame per call (the one-frame step)", 1, False),
            ("step alone, 1 frame per call, free-frame-count step", 1, True),
            ("step alone, 2 frames per call", 2, False),
        ]
    engines = {k: StreamingEnhancer(model, backend=s) for k, s in steppers.items()}

    # speed
    x = test_signal(args.seconds)[None]
    speed: list[dict[str, Any]] = []
    for what, frames, free in rows:
        timers = {
            k: native_step_timer(s, frames, args.calls) if native else step_timer(s, frames, args.calls, free)
            for k, s in steppers.items()
        }
        t = fastest_alternating(timers, 5)
        for k in kinds:
            speed.append(
                {"what": what, "kind": k, "ms_per_call": 1000 * t[k], "rtf": t[k] / (0.016 * frames)}
            )
    for chunk in (256, 512):
        for e in engines.values():
            rtf(e, x, chunk)  # warm-up
        r = fastest_alternating({k: functools.partial(rtf, e, x, chunk) for k, e in engines.items()}, 3)
        for k in kinds:
            speed.append(
                {"what": f"streaming engine, {chunk // 16} ms chunks", "kind": k, "ms_per_call": math.nan}
                | {"rtf": r[k]}
            )

    # accuracy
    scorer = None if args.no_dnsmos else DNSMOS()
    per_file: list[dict[str, Any]] = []
    diffs: list[float] = []
    for i, pair in enumerate(pairs):
        noisy, _, _ = load_mono_16k(pair.noisy_path)
        clean, _, _ = load_mono_16k(pair.clean_path)
        outs = {k: enhance(e, noisy) for k, e in engines.items()}
        err = float(np.sum((outs[reduced] - outs["float32"]) ** 2))
        diffs.append(10 * math.log10(float(np.sum(outs["float32"] ** 2)) / max(err, 1e-20)))
        for k in kinds:
            per_file.append({"name": pair.name, "system": k} | compute_metrics(clean, outs[k], scorer))
        if (i + 1) % 20 == 0:
            print(f"[bench_int8] {i + 1}/{len(pairs)} pairs", file=sys.stderr)
    sides = {
        k: {r["name"]: {m: str(r[m]) for m in METRIC_KEYS} for r in per_file if r["system"] == k}
        for k in kinds
    }
    metrics = [m for m in METRIC_KEYS if scorer is not None or not m.startswith("dnsmos")]
    paired = bench_paired.paired(sides["float32"], sides[reduced], metrics)

    cmd = "python bench/bench_int8.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    base = args.backend.rsplit("-", 1)[0]
    if native:
        size = (
            f"Weights read per frame: {steppers['float32'].weight_bytes / 2**20:.1f} MiB float32, "
            f"{steppers[reduced].weight_bytes / 2**20:.1f} MiB with {reduced} matrices."
        )
    elif traced:
        total = sum(p.numel() for p in model.parameters())
        convs = sum(b.conv.weight.numel() for b in model.pre_encoder.blocks)  # type: ignore[union-attr]
        size = (
            f"Weights read per frame: {4 * total / 2**20:.1f} MiB float32, "
            f"{(4 * (total - convs) + convs) / 2**20:.1f} MiB with the pre-encoder's products in int8."
        )
    else:
        size = (
            f"Step file: {steppers['float32'].step_bytes / 2**20:.1f} MiB float32, "
            f"{steppers[reduced].step_bytes / 2**20:.1f} MiB {reduced}."
        )
    lines = [
        f"{args.backend} against {base} (float32) streaming step, {time.strftime('%Y-%m-%d %H:%M')}, "
        f"{cpu_summary()}, one thread; model "
        f"{model_label(args)}. Load average before the run: {load_before:.2f}.",
        "",
        f"Command: `{cmd.strip()}`",
        "",
        size,
        "",
        f"| what | float32 ms/call | {reduced} ms/call | float32 RTF | {reduced} RTF | {reduced} / float32 |",
        "|---|---|---|---|---|---|",
    ]
    for a, b in zip(speed[::2], speed[1::2], strict=True):
        ms = "–" if math.isnan(a["ms_per_call"]) else f"{a['ms_per_call']:.3f}"
        ms8 = "–" if math.isnan(b["ms_per_call"]) else f"{b['ms_per_call']:.3f}"
        lines.append(
            f"| {a['what']} | {ms} | {ms8} | {a['rtf']:.3f} | {b['rtf']:.3f} | {b['rtf'] / a['rtf']:.2f} |"
        )
    d = np.array(diffs)
    lines += [
        "",
        f"Accuracy on {len(pairs)} pair(s){' under `' + args.pairs + '`' if args.pairs else ' (the example file)'}: "
        f"{reduced} output against float32 output, signal to difference median {np.median(d):.1f} dB "
        f"(min {d.min():.1f}, max {d.max():.1f}). Scores against the clean files (base = float32, new = {reduced}):",
        "",
        bench_paired.markdown(paired),
    ]
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "speed.csv", ["what", "kind", "ms_per_call", "rtf"], speed)
    write_csv(out / "paired.csv", bench_paired.COLUMNS, paired)
    write_csv(out / "per_file.csv", ["name", "system", *METRIC_KEYS], per_file)
    write_text(out / "summary.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
