"""The incremental step exported to ONNX and run with onnxruntime: an alternative backend of the streaming engine.

    path = export_step(model, "step.onnx")           # once per model
    engine = StreamingEnhancer(model, backend=OnnxStepper(path, model))

:class:`OnnxStepper` has the contract of :meth:`models.enhancer.Enhancer.step` (frames in, the output frames they
complete out), so the engine's framing, overlap-add and latency are unchanged; results equal the PyTorch backend
to float32 rounding (tested). Needs ``onnx`` (export) and ``onnxruntime`` (run): ``pip install 'tim-enhance[onnx]'``.
"""

from __future__ import annotations

import copy
import os
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
    """``python -m enhance.onnx_backend --out step.onnx [--model default | --checkpoint PATH]``"""
    import argparse

    from models.checkpoint import load_checkpoint
    from models.pretrained import load_pretrained

    ap = argparse.ArgumentParser(description="Export a model's streaming step to ONNX.")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--model", default="default")
    g.add_argument("--checkpoint")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    ck = load_checkpoint(args.checkpoint) if args.checkpoint else load_pretrained(args.model)
    print(export_step(ck.model, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
