"""The incremental step exported to ONNX and run with onnxruntime: an alternative backend of the streaming engine.

    path = export_step(model, "step.onnx")           # once per model
    engine = StreamingEnhancer(model, backend=OnnxStepper(path))

:class:`OnnxStepper` has the contract of :meth:`models.enhancer.Enhancer.step` (frames in, the output frames they
complete out), so the engine's framing, overlap-add and latency are unchanged; results equal the PyTorch backend
to float32 rounding (tested). Needs ``onnx`` (export) and ``onnxruntime`` (run): ``pip install 'tim-enhance[onnx]'``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from enhance.audio_io import atomic_path
from models.enhancer import Enhancer, EnhancerOutput
from models.static_step import StaticStep


def export_step(model: Enhancer, path: str | os.PathLike[str], opset: int = 17) -> Path:
    """Write the one-frame step of ``model`` (float32, any batch = channel count) to ``path``, atomically.

    The model's train/eval mode is left as it was (the exporter restores the wrapper's mode, recursively, and a
    new module is in training mode: without the explicit eval() below, dropout would be switched on).
    """
    was_training = model.training
    step = StaticStep(model.float()).eval()
    shapes = step.state_shapes(batch=1)
    n_bins = model.cfg.pre_encoder.n_bins
    inputs = [torch.zeros(1, 1, n_bins)] + [
        torch.zeros(s, dtype=torch.bool) if name == "valid" else torch.zeros(s) for name, s in shapes
    ]
    n_maps = len([b for b in model.competition_blocks])
    input_names = ["feat"] + [name for name, _ in shapes]
    output_names = (
        ["log_mag"] + [f"competition_{i}" for i in range(n_maps)] + [f"new_{name}" for name, _ in shapes]
    )
    dynamic = {name: {0: "batch"} for name in input_names + output_names if not name.endswith("valid")}
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
    model.train(was_training)
    return Path(path)


@dataclass
class OnnxState:
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    started: bool = False
    frames_in: int = 0
    frames_out: int = 0


class OnnxStepper:
    """Runs an exported step with onnxruntime (CPU, ``threads`` intra-op threads)."""

    def __init__(self, path: str | os.PathLike[str], model: Enhancer, threads: int = 1) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.static = StaticStep(model)
        self.n_bins = model.cfg.pre_encoder.n_bins
        self.n_maps = len(model.competition_blocks)

    def new_state(self, batch: int) -> OnnxState:
        tensors = {
            name: np.zeros(shape, dtype=bool if name == "valid" else np.float32)
            for name, shape in self.static.state_shapes(batch)
        }
        return OnnxState(tensors)

    def step(
        self,
        feats: torch.Tensor,
        state: OnnxState | None,
        final: bool = False,
        return_competition: bool = False,
    ) -> tuple[EnhancerOutput, OnnxState]:
        x = feats.detach().float().cpu().numpy()
        state = state or self.new_state(x.shape[0])
        frames = [x[:, i : i + 1] for i in range(x.shape[1])]
        if final and (state.started or frames):
            frames.append(np.zeros((x.shape[0], 1, self.n_bins), np.float32))  # the end's zero padding
        outs: list[np.ndarray] = []
        maps: list[list[np.ndarray]] = [[] for _ in range(self.n_maps)]
        names = list(state.tensors)
        for frame in frames:
            state.frames_in += 1
            if not state.started:  # frame 0: nothing to output before its lookahead frame arrives
                conv0 = state.tensors["conv_0"]
                state.tensors["conv_0"] = np.concatenate([conv0[:, :, 1:], frame.transpose(0, 2, 1)], axis=2)
                state.started = True
                continue
            result = self.session.run(None, {"feat": frame, **state.tensors})
            outs.append(result[0])
            for store, c in zip(maps, result[1 : 1 + self.n_maps], strict=True):
                store.append(c)
            state.tensors = dict(zip(names, result[1 + self.n_maps :], strict=True))
        if final:
            state.frames_in -= 1  # the padding frame is not input
        log_mag = np.concatenate(outs, axis=1) if outs else np.zeros((x.shape[0], 0, self.n_bins), np.float32)
        state.frames_out += log_mag.shape[1]
        competition = (
            [torch.from_numpy(np.concatenate(m, axis=1)) for m in maps]
            if return_competition and outs
            else None
        )
        return EnhancerOutput(torch.from_numpy(log_mag), competition), state


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
