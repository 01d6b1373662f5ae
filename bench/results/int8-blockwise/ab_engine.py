"""Session 29: the onnxruntime-int8 backend's weights per tensor (onnxruntime's dynamic quantisation, the
quantiser until session 29) against per block of 32 (enhance.onnx_graph, its replacement), timed alternately in
one process: the one-frame step alone and the streaming engine with 16-ms and 32-ms chunks.

    python bench/results/int8-blockwise/ab_engine.py [--rounds 9]    # from the repository root

Also times the blockwise step without the layout rewrites (enhance.onnx_graph.simplify_layout), to show what
they save. Prints a Markdown table of the fastest round of each and the ratios.
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ["OMP_NUM_THREADS"] = "1"
ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import torch  # noqa: E402
from bench_chunk_sizes import fastest_alternating, rtf  # noqa: E402
from bench_streaming import test_signal  # noqa: E402

from enhance import onnx_graph  # noqa: E402
from enhance.atomic_files import atomic_path  # noqa: E402
from enhance.onnx_backend import OnnxStepper, _read_origin, _write_origin, export_step  # noqa: E402
from enhance.streaming import StreamingEnhancer  # noqa: E402
from models.pretrained import load_pretrained  # noqa: E402


def per_tensor(src: Path, dst: Path) -> None:
    """The quantiser before session 29 (git show 67c7970:enhance/onnx_backend.py, quantize_step)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        folded = Path(tmp) / "folded.onnx"
        onnx_graph.fold_constants(src, folded)
        quantize_dynamic(str(folded), str(dst), weight_type=QuantType.QInt8, reduce_range=True)
    _write_origin(dst, _read_origin(src))


def per_tensor_step(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Path:
    """:func:`per_tensor` with the signature of enhance.onnx_backend.quantize_step (atomic), to stand in for it."""
    with atomic_path(dst) as out:
        per_tensor(Path(src), Path(out))
    return Path(dst)


def blockwise(src: Path, dst: Path, simplify: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folded = Path(tmp) / "folded.onnx"
        onnx_graph.fold_constants(src, folded)
        model = onnx.load(str(folded))
    onnx_graph.blockwise_int8(model)
    if simplify:
        onnx_graph.simplify_layout(model)
    onnx.save(model, str(dst))
    _write_origin(dst, _read_origin(src))


def step_ms(stepper: OnnxStepper, calls: int = 300) -> float:
    session = stepper.one_frame_session
    feed = {
        i.name: np.zeros([1 if isinstance(d, str) else d for d in i.shape], np.float32)
        for i in session.get_inputs()
    }
    feed["feat"][:] = 1.0
    t0 = time.perf_counter()
    for _ in range(calls):
        session.run(None, feed)
    return (time.perf_counter() - t0) / calls * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load_pretrained("default").model
    x = test_signal(args.seconds)[None]
    kinds = {
        "per tensor (before)": "tensor",
        "per block, no layout rewrites": "block-raw",
        "per block (now)": "block",
    }
    steppers = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for frames in (None, 1):
            export_step(model, d / f"float-{frames}.onnx", frames=frames)
        for label, kind in kinds.items():
            paths = []
            for frames in (None, 1):
                src, dst = d / f"float-{frames}.onnx", d / f"{kind}-{frames}.onnx"
                per_tensor(src, dst) if kind == "tensor" else blockwise(src, dst, simplify=kind == "block")
                paths.append(dst)
            steppers[label] = OnnxStepper(paths[0], model, one_frame=paths[1])
    engines = {k: StreamingEnhancer(model, backend=s) for k, s in steppers.items()}
    for e in engines.values():  # warm-up
        rtf(e, x[:, :16000], 256)
    load = os.getloadavg()[0]
    rows = {
        "one-frame step alone (ms per call)": fastest_alternating(
            {k: (lambda s=s: step_ms(s)) for k, s in steppers.items()}, args.rounds
        ),
        "engine, 16-ms chunks (real-time factor)": fastest_alternating(
            {k: (lambda e=e: rtf(e, x, 256)) for k, e in engines.items()}, args.rounds
        ),
        "engine, 32-ms chunks (real-time factor)": fastest_alternating(
            {k: (lambda e=e: rtf(e, x, 512)) for k, e in engines.items()}, args.rounds
        ),
    }
    base = next(iter(kinds))
    print(
        f"load average before: {load:.2f}; fastest of {args.rounds} alternating rounds, {args.seconds:g} s signal\n"
    )
    print("| | " + " | ".join(kinds) + " | per block / per tensor |")
    print("|---|" + "---|" * (len(kinds) + 1))
    for name, row in rows.items():
        cells = " | ".join(f"{v:.3f}" if "ms" in name else f"{v:.4f}" for v in row.values())
        print(f"| {name} | {cells} | {row['per block (now)'] / row[base]:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
