"""Streaming speed by chunk size and backend: which backend to pick for which caller.

    python bench/bench_chunk_sizes.py [--model default | --checkpoint PATH] [--seconds 10] [--rounds 3]
        [--backends pytorch,torchscript,torchscript-int8,native,native-fp16,native-int8,onnxruntime,
                    onnxruntime-int8]

The streaming engine runs the same audio fed in chunks of 256 (one 16 ms hop), 512, 800, 1600, 4800 and 16000
samples, once per backend (``enhance.backends``), on one CPU thread in this process, after an untimed warm-up.
Each chunk size is timed ``--rounds`` times with the backends alternating, and each backend's fastest pass is
reported (timings on a shared machine drift; alternating lets a slow spell hit every backend alike). Reported:
real-time factor (compute time / audio duration) per chunk size and backend, and each backend's time relative
to TorchScript's. A backend that cannot be built here (the onnx extra missing) is left out with the reason.
Prints a Markdown table and writes ``bench/results/chunk-sizes.md``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from machine import command_line, cpu_summary  # noqa: E402  (bench/machine.py)
from model_arg import add_model_args, load_model  # noqa: E402  (bench/model_arg.py)

from bench.bench_streaming import test_signal  # noqa: E402
from enhance.backends import streaming_backend  # noqa: E402
from enhance.streaming import StreamingEnhancer  # noqa: E402
from recipes.run_folder import write_text  # noqa: E402

T = TypeVar("T")

CHUNKS = (256, 512, 800, 1600, 4800, 16000)
BACKENDS = (
    "pytorch",
    "torchscript",
    "torchscript-int8",
    "native",
    "native-fp16",
    "native-int8",
    "onnxruntime",
    "onnxruntime-int8",
)


def fastest_alternating(fns: dict[T, Callable[[], float]], rounds: int) -> dict[T, float]:
    """The smallest of ``rounds`` results of each function, the functions run in turn round by round (so a slow
    spell of a shared machine hits all of them alike)."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(max(1, rounds)):
        for key, fn in fns.items():
            best[key] = min(best[key], fn())
    return best


def rtf(engine: StreamingEnhancer, x: np.ndarray, chunk: int) -> float:
    engine.reset()
    t0 = time.perf_counter()
    for i in range(0, x.shape[1], chunk):
        engine.process(x[:, i : i + chunk])
    engine.flush()
    return (time.perf_counter() - t0) / (x.shape[1] / 16000)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3, help="passes per chunk size and backend (fastest kept)")
    ap.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated (default: %(default)s)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "chunk-sizes.md"))
    args = ap.parse_args()
    unknown = [b for b in args.backends.split(",") if b not in BACKENDS]
    if unknown:  # a typo is a usage error, not a "Not run" row
        ap.error(f"unknown backend(s) {', '.join(unknown)}; known: {', '.join(BACKENDS)}")
    torch.set_num_threads(1)
    ck = load_model(args)
    model = ck.model.eval()
    x = test_signal(args.seconds)[None]
    load_before = os.getloadavg()[0]
    engines: dict[str, StreamingEnhancer] = {}
    missing: list[str] = []
    for b in args.backends.split(","):
        try:
            engines[b] = StreamingEnhancer(model, backend=streaming_backend(model, b))
        except (ImportError, ValueError, RuntimeError) as exc:  # RuntimeError: no C compiler for native
            missing.append(f"{b}: {exc}")
    for engine in engines.values():  # warm-up: first-call allocations, TorchScript's specialisation
        for chunk in CHUNKS:
            rtf(engine, x[:, :16000], chunk)
    names = list(engines)
    rows = []
    for chunk in CHUNKS:
        best = fastest_alternating(
            {b: functools.partial(rtf, engines[b], x, chunk) for b in names}, args.rounds
        )
        ref = best.get("torchscript")
        cells = [
            f"{best[b]:.3f}" + (f" ({best[b] / ref:.2f})" if ref and b != "torchscript" else "")
            for b in names
        ]
        rows.append(f"| {chunk} | {1000 * chunk / 16000:g} | " + " | ".join(cells) + " |")
    text = (
        f"Streaming engine by chunk size, one CPU thread, {args.seconds:g} s of audio, "
        f"{cpu_summary()}, {time.strftime('%Y-%m-%d')}. "
        f"Command: `{command_line()}`. Load average before the run: {load_before:.2f}. "
        "Real-time factor, the fastest of the alternating passes; in brackets, relative to TorchScript. "
        "torchscript-int8, native-fp16, native-int8 and onnxruntime-int8 are not the float output "
        "(bench/bench_int8.py).\n\n"
        "| chunk (samples) | chunk (ms) | " + " | ".join(f"RTF {b}" for b in names) + " |\n"
        "|---|---|"
        + "---|" * len(names)
        + "\n"
        + "\n".join(rows)
        + "\n"
        + "".join(f"\nNot run: {m}\n" for m in missing)
    )
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_text(Path(args.out), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
