"""Streaming backends that run the model's fixed-shape one-frame step (:class:`models.static_step.StaticStep`).

:class:`FixedStepper` is the host: it keeps each channel's state (conv caches, the k/v ring buffers and their
``valid`` mask), writes each step's new k/v into the ring's oldest slot, holds back frame 0 for the lookahead and
feeds the end's zero padding, so that it has the contract of :meth:`models.enhancer.Enhancer.step` and plugs into
:class:`enhance.streaming.StreamingEnhancer` as ``backend``. Runners:

* :class:`TracedStepper`: the step traced and frozen with TorchScript (no Python per op);
* :class:`enhance.onnx_backend.OnnxStepper`: the step exported to ONNX, run with onnxruntime.

Both equal the PyTorch step to float32 rounding (tested).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch

from models.enhancer import Enhancer, EnhancerOutput
from models.static_step import StaticStep


@dataclass
class FixedState:
    """Per channel: the step's state tensors (conv caches, the ``valid`` mask and the k/v(/u) ring buffers) and
    the ring slot the next frame is written to."""

    channels: list[dict[str, np.ndarray]] = field(default_factory=list)
    slot: int = 0
    started: bool = False
    frames_out: int = 0


class FixedStepper:
    """The host of a fixed-shape step: :meth:`Enhancer.step`'s contract (frames in, the output frames they
    complete out) on top of :meth:`run`, which subclasses implement (onnxruntime, TorchScript)."""

    def __init__(self, model: Enhancer) -> None:
        if model.cfg.context_frames < 1:
            raise ValueError("the fixed-shape step needs context_frames >= 1; use the PyTorch backend")
        self.static = StaticStep(model)
        self.n_bins = model.cfg.pre_encoder.n_bins
        self.n_maps = len(model.competition_blocks)
        self.context = model.cfg.context_frames
        names = [name for name, _ in self.static.state_shapes(1)]
        self.conv_names = [n for n in names if n.startswith("conv_")]
        self.ring_names = [n for n in names if n != "valid" and not n.startswith("conv_")]

    def new_state(self, batch: int) -> FixedState:
        def one() -> dict[str, np.ndarray]:
            return {
                name: np.zeros(shape, dtype=bool if name == "valid" else np.float32)
                for name, shape in self.static.state_shapes(1)
            }

        return FixedState([one() for _ in range(batch)])

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """One call of the exported step: inputs by name -> outputs in :class:`StaticStep`'s order."""
        raise NotImplementedError

    def _run(self, frame: np.ndarray, tensors: dict[str, np.ndarray], slot: int) -> list[np.ndarray]:
        """One frame [1, 1, F] of one channel; updates ``tensors`` in place; returns (log_mag, maps...)."""
        result = self.run({"feat": frame, **tensors})
        n_head = 1 + self.n_maps
        for name, new in zip(self.conv_names, result[n_head : n_head + len(self.conv_names)], strict=True):
            tensors[name] = new
        rest = result[n_head + len(self.conv_names) :]
        for name, new in zip(
            self.ring_names, rest, strict=True
        ):  # the oldest slot: its frame left the window
            if name.startswith("k_"):  # keys are stored transposed: [B, H, Dh, C]
                tensors[name][..., slot] = new[..., 0]
            else:
                tensors[name][:, :, slot] = new[:, :, 0]
        tensors["valid"][slot] = True
        return result[:n_head]

    def step(
        self,
        feats: torch.Tensor,
        state: FixedState | None,
        final: bool = False,
        return_competition: bool = False,
    ) -> tuple[EnhancerOutput, FixedState]:
        x = feats.detach().float().cpu().numpy()
        state = state or self.new_state(x.shape[0])
        frames = [x[:, i : i + 1] for i in range(x.shape[1])]
        if final and (state.started or frames):
            frames.append(np.zeros((x.shape[0], 1, self.n_bins), np.float32))  # the end's zero padding
        outs: list[np.ndarray] = []
        maps: list[list[np.ndarray]] = [[] for _ in range(self.n_maps)]
        for frame in frames:
            if not state.started:  # frame 0: nothing to output before its lookahead frame arrives
                for b, tensors in enumerate(state.channels):
                    conv0 = tensors["conv_0"]
                    tensors["conv_0"] = np.concatenate(
                        [conv0[:, :, 1:], frame[b : b + 1].transpose(0, 2, 1)], axis=2
                    )
                state.started = True
                continue
            per_channel = [
                self._run(np.ascontiguousarray(frame[b : b + 1]), tensors, state.slot)
                for b, tensors in enumerate(state.channels)
            ]
            state.slot = (state.slot + 1) % self.context
            outs.append(np.concatenate([r[0] for r in per_channel], axis=0))
            if return_competition:
                for i, store in enumerate(maps):
                    store.append(np.concatenate([r[1 + i] for r in per_channel], axis=0))
        log_mag = np.concatenate(outs, axis=1) if outs else np.zeros((x.shape[0], 0, self.n_bins), np.float32)
        state.frames_out += log_mag.shape[1]
        competition = (
            [torch.from_numpy(np.concatenate(m, axis=1)) for m in maps]
            if return_competition and outs
            else None
        )
        return EnhancerOutput(torch.from_numpy(log_mag), competition), state


class TracedStepper(FixedStepper):
    """The step traced with TorchScript, frozen and optimised for inference (CPU, float32)."""

    def __init__(self, model: Enhancer) -> None:
        super().__init__(model)
        step = StaticStep(
            copy.deepcopy(model).float()
        ).eval()  # float32, without converting the caller's model
        example = [torch.zeros(1, 1, self.n_bins)] + [
            torch.zeros(s, dtype=torch.bool) if name == "valid" else torch.zeros(s)
            for name, s in step.state_shapes(1)
        ]
        with torch.no_grad():
            traced = torch.jit.trace(step, tuple(example), check_trace=False)
            self.module = torch.jit.optimize_for_inference(torch.jit.freeze(traced.eval()))
        self.names = ["feat"] + [name for name, _ in step.state_shapes(1)]

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            out = self.module(*(torch.from_numpy(feed[n]) for n in self.names))
        return [t.numpy() for t in out]
