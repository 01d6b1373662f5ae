"""The incremental step exported to ONNX and run with onnxruntime: an alternative backend of the streaming engine.

    path = export_step(model, "step.onnx")           # once per model
    engine = StreamingEnhancer(model, backend=OnnxStepper(path, model))

:class:`OnnxStepper` has the contract of :meth:`models.enhancer.Enhancer.step` (frames in, the output frames they
complete out), so the engine's framing, overlap-add and latency are unchanged; results equal the PyTorch backend
to float32 rounding (tested). Needs ``onnx`` (export) and ``onnxruntime`` (run): ``pip install 'tim-enhance[onnx]'``.

:func:`quantize_step` makes an int8 copy of an exported step (the ``onnxruntime-int8`` backend): its weights are a
quarter of the bytes, which is what a per-hop stream spends most of its time reading. It is not the same numbers:
the output differs from float32 by about 38 dB (signal to difference) and scores the same on the dev pairs
(``bench/bench_int8.py``).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from enhance.audio_io import atomic_path
from enhance.fixed_step import FixedStepper
from models.enhancer import Enhancer
from models.static_step import StaticStep


def export_step(model: Enhancer, path: str | os.PathLike[str], opset: int = 17) -> Path:
    """Write the step of ``model`` (float32, one channel, any number of new frames per call) to ``path``,
    atomically.

    The step is exported from a float32 copy in eval mode (a new module is in training mode: without the explicit
    eval() below, dropout would be switched on); the caller's model is left as it was.
    """
    step = StaticStep(copy.deepcopy(model).float()).eval()  # float32, without converting the caller's model
    shapes = step.state_shapes(batch=1, frames=2)  # exported with 2 new frames; the number stays free
    n_bins = model.cfg.pre_encoder.n_bins
    inputs = [torch.zeros(1, 2, n_bins)] + [torch.zeros(s) for _, s in shapes]
    n_maps = len(model.competition_blocks)
    input_names = ["feat"] + [name for name, _ in shapes]
    output_names = (
        ["log_mag"]
        + [f"competition_{i}" for i in range(n_maps)]
        + [f"new_{name}" for name, _ in shapes if name != "mask"]
    )
    # the axes that count new frames (the state's other sizes are fixed)
    dynamic = {"feat": {1: "frames"}, "mask": {0: "frames", 1: "slots_and_frames"}, "log_mag": {1: "frames"}}
    dynamic.update({f"competition_{i}": {1: "frames"} for i in range(n_maps)})
    for name, _ in shapes:
        if name.startswith(("k_", "v_", "u_")):
            dynamic[f"new_{name}"] = {3 if name.startswith("k_") else 2: "frames"}
    with atomic_path(path) as tmp, torch.no_grad():
        torch.onnx.export(
            step,
            tuple(inputs),
            tmp,
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic,
            opset_version=opset,
            dynamo=False,
        )
    return Path(path)


@contextlib.contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """onnxruntime's quantiser logs advice through the root logger (and so would install a handler on it):
    hold it back, and leave the root logger as it was."""
    root = logging.getLogger()
    handler, level = logging.NullHandler(), root.level
    root.addHandler(handler)
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def quantize_step(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Path:
    """Write ``src`` (a step from :func:`export_step`) to ``dst`` with the constant weights of all its matrix
    products in int8, atomically: onnxruntime's dynamic quantisation (per-tensor int8 weights; each product's
    input is quantised to uint8 as it runs).

    The graph is first constant-folded (onnxruntime's pre-processing, without its symbolic shape inference, which
    gives up on the step's free frame count): the pre-encoder's conv weights are reshaped in the graph, and
    unfolded they would stay float32, 2.7M of the 5.9M weights. 7-bit weights (``reduce_range``) keep the
    products exact on CPUs without VNNI instructions too, at a small cost (about 1.4 dB of the signal-to-difference
    ratio here). Per-channel weights were tried: onnxruntime 1.31 refuses them at run time for the per-mechanism
    (batched) products."""
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory() as tmp, atomic_path(dst) as out, _quiet_root_logger():
        folded = Path(tmp) / "folded.onnx"
        quant_pre_process(str(src), str(folded), skip_symbolic_shape=True)
        quantize_dynamic(str(folded), out, weight_type=QuantType.QInt8, reduce_range=True)
    return Path(dst)


class OnnxStepper(FixedStepper):
    """Runs an exported step with onnxruntime (CPU, ``threads`` intra-op threads), one channel at a time, up to 64
    frames per call (like :class:`enhance.fixed_step.TracedStepper`)."""

    max_frames = 64

    def __init__(self, path: str | os.PathLike[str], model: Enhancer, threads: int = 1) -> None:
        import onnxruntime as ort

        super().__init__(model)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        inputs = {i.name: i for i in self.session.get_inputs()}
        feat, mask = inputs.get("feat"), inputs.get("mask")
        if feat is None or mask is None or mask.type != "tensor(float)" or isinstance(feat.shape[1], int):
            # files from before the multi-frame export: one frame per call and a boolean mask
            raise ValueError(
                f"{path} is not a step exported by this version of tim-enhance (it needs a float mask and a free "
                f"number of frames); export it again: python -m enhance.onnx_backend --out {path}"
            )

    def run(self, feed: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        outs = self.session.run(None, {name: t.numpy() for name, t in feed.items()})
        return [torch.from_numpy(o) for o in outs]


def main(argv: list[str] | None = None) -> int:
    """``python -m enhance.onnx_backend --out step.onnx [--model default | --checkpoint PATH] [--int8]``"""
    import argparse

    from models.checkpoint import load_checkpoint
    from models.pretrained import load_pretrained

    ap = argparse.ArgumentParser(description="Export a model's streaming step to ONNX.")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--model", default="default")
    g.add_argument("--checkpoint")
    ap.add_argument("--out", required=True)
    ap.add_argument("--int8", action="store_true", help="int8 weights (the onnxruntime-int8 backend's step)")
    args = ap.parse_args(argv)
    ck = load_checkpoint(args.checkpoint) if args.checkpoint else load_pretrained(args.model)
    if not args.int8:
        print(export_step(ck.model, args.out))
        return 0
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(quantize_step(export_step(ck.model, Path(tmp) / "step.onnx"), args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
