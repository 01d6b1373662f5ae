"""Streaming backends that run the model's fixed-shape step (:class:`models.static_step.StaticStep`).

:class:`FixedStepper` is the host: it keeps each channel's state (conv caches, the k/v ring buffers), which frame
each ring slot holds, and from that the mask of what each new frame may see; it writes each step's new k/v into
the ring's oldest slots, holds back frame 0 for the lookahead and feeds the end's zero padding, so that it has the
contract of :meth:`models.enhancer.Enhancer.step` and plugs into :class:`enhance.streaming.StreamingEnhancer` as
``backend``; its :meth:`FixedStepper.run_frames` also does the engine's signal path around the step (analysis,
synthesis with the noisy phase, overlap-add) in NumPy. Runners:

* :class:`TracedStepper`: the step traced and frozen with TorchScript (no Python per op), up to 64 frames per call
  (``int8``: with the pre-encoder's products in int8, :mod:`enhance.torch_int8`);
* :class:`enhance.onnx_backend.OnnxStepper`: the step exported to ONNX, run with onnxruntime, also up to 64 frames.

Both equal the PyTorch step to float32 rounding (tested), but for the int8 ones, which are close to it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from enhance.stft import sqrt_hann
from models.enhancer import Enhancer, EnhancerOutput, WeightsWatch
from models.static_step import StaticStep, slot_axis


@dataclass
class FixedState:
    """One stream's state: per channel, the step's tensors (conv caches and the k/v(/u) ring buffers, updated in
    place: each keeps its memory for the life of the stream); whether frame 0 has arrived; how many frames have
    gone through the step (one output frame each); and per channel, what the runner keeps between calls (None
    until it needs something: :class:`enhance.onnx_backend.OnnxStepper` binds the channel's tensors to its
    one-frame session once). Frame f sits in ring slot ``f % context_frames``, so which frame each slot holds
    follows from ``frames_out``."""

    channels: list[dict[str, torch.Tensor]] = field(default_factory=list)
    started: bool = False
    frames_out: int = 0
    runners: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.runners) != len(self.channels):  # none given: nothing kept yet
            self.runners = [None] * len(self.channels)


class FixedStepper:
    """The host of a fixed-shape step: :meth:`Enhancer.step`'s contract (frames in, the output frames they
    complete out) on top of :meth:`run`, which subclasses implement (onnxruntime, TorchScript). A call's frames
    go through the step ``min(max_frames, context_frames)`` at a time (TorchScript and ONNX: up to 64, so that
    large chunks read the weights once per call instead of once per frame; never more than the ring's slots).
    The host works on float32 CPU tensors in place (the per-hop cost of a real-time stream is mostly fixed costs)."""

    max_frames = 1
    # True where run() executes a copy made when the stepper was built (traced, exported): the model's attenuation
    # limit is then baked in, and a later Enhancer.set_max_attenuation would silently not apply
    limit_baked_in = False

    def __init__(self, model: Enhancer) -> None:
        self.static = StaticStep(model)  # raises for a model it does not cover
        self.model = model
        self.built_limit = model.cfg.max_attenuation_db
        self.weights = WeightsWatch(model)
        self.n_bins = model.cfg.pre_encoder.n_bins
        self.n_maps = len(model.competition_blocks)
        self.context = model.cfg.context_frames
        self.hop = model.cfg.stft.hop_length  # win_length == n_fft == 2 * hop (STFTConfig)
        self.window = sqrt_hann(model.cfg.stft.win_length).numpy()
        names = [name for name, _ in self.static.state_shapes(1)]
        self.conv_names = [n for n in names if n.startswith("conv_")]
        self.ring_names = [n for n in names if n != "mask" and not n.startswith("conv_")]
        # a full ring and one new frame: every slot is within the frame's context (the common real-time case)
        self._open_mask = torch.zeros(1, self.context + 1)

    def new_state(self, batch: int) -> FixedState:
        def one() -> dict[str, torch.Tensor]:
            return {name: torch.zeros(shape) for name, shape in self.static.state_shapes(1) if name != "mask"}

        return FixedState([one() for _ in range(batch)])

    def run(self, feed: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """One call of the traced/exported step: inputs by name -> outputs in :class:`StaticStep`'s order."""
        raise NotImplementedError

    def _mask(self, done: int, n: int) -> torch.Tensor:
        """Additive mask [n, C + n] after ``done`` frames (0: visible, -inf: hidden): new frame i (frame
        ``done + i``) sees the ring slots holding frames ``done + i - C`` ... ``done - 1`` (slot s holds the last
        frame f < done with f % C == s, if any), and new frames 0 ... i."""
        if n == 1 and done >= self.context:
            return self._open_mask
        held = done - 1 - (done - 1 - np.arange(self.context)) % self.context  # < 0: empty slot
        t = done + np.arange(n)
        ring = (held[None, :] >= 0) & (held[None, :] >= t[:, None] - self.context)
        visible = np.concatenate([ring, np.tri(n, dtype=bool)], axis=1)
        return torch.from_numpy(np.where(visible, 0.0, -np.inf).astype(np.float32))

    def _run(
        self, frames: torch.Tensor, state: FixedState, channel: int, mask: torch.Tensor, first_slot: int
    ) -> list[torch.Tensor]:
        """``frames`` [1, n, F] of channel ``channel``; updates its tensors in place; returns (log_mag, maps...).
        The new frames go to slots ``first_slot ...`` (mod C)."""
        tensors = state.channels[channel]
        result = self.run({"feat": frames, "mask": mask, **tensors})
        n_head = 1 + self.n_maps
        self._keep_new(tensors, result[n_head:], frames.shape[1], first_slot)
        return result[:n_head]

    def _keep_new(
        self, tensors: dict[str, torch.Tensor], new_state: list[torch.Tensor], n: int, first_slot: int
    ) -> None:
        """The step's new conv caches and the new frames' k/v(/u) (``new_state``, in :class:`StaticStep`'s order)
        into the channel's ``tensors``, in place: the caches overwritten, the frames into the ring's oldest
        slots."""
        for name, new in zip(self.conv_names, new_state[: len(self.conv_names)], strict=True):
            tensors[name].copy_(new)  # in place: a runner may have bound the tensor's memory

        wrap = first_slot + n > self.context
        slots = torch.arange(first_slot, first_slot + n) % self.context if wrap else None
        rest = new_state[len(self.conv_names) :]
        for name, new in zip(self.ring_names, rest, strict=True):  # into the oldest slots
            ring, dim = tensors[name], slot_axis(name)
            if slots is None:
                ring.narrow(dim, first_slot, n).copy_(new)
            else:
                ring.index_copy_(dim, slots, new)

    def step(
        self,
        feats: torch.Tensor,
        state: FixedState | None,
        final: bool = False,
        return_competition: bool = False,
    ) -> tuple[EnhancerOutput, FixedState]:
        self.weights.check(type(self).__name__)  # the static step holds fused copies of them
        if self.limit_baked_in and self.model.cfg.max_attenuation_db != self.built_limit:
            raise ValueError(
                f"this {type(self).__name__} was built with the model's attenuation limit "
                f"({_db(self.built_limit)}), and the model's is now {_db(self.model.cfg.max_attenuation_db)}: "
                "build a new backend (enhance.backends.streaming_backend) after set_max_attenuation"
            )
        x = feats.detach().to("cpu", torch.float32)
        state = state or self.new_state(x.shape[0])
        if final and (state.started or x.shape[1]):  # the end's zero padding
            x = torch.cat([x, x.new_zeros(x.shape[0], 1, self.n_bins)], dim=1)
        if not state.started and x.shape[1]:  # frame 0: nothing to output before its lookahead frame arrives
            for b, tensors in enumerate(state.channels):
                conv0 = tensors["conv_0"]
                conv0.copy_(torch.cat([conv0[:, :, 1:], x[b : b + 1, :1].transpose(1, 2)], dim=2))
            state.started = True
            x = x[:, 1:]
        outs: list[torch.Tensor] = []
        maps: list[list[torch.Tensor]] = [[] for _ in range(self.n_maps)]
        size = min(self.max_frames, self.context)  # a step's new frames must fit in the ring's oldest slots
        for start in range(0, x.shape[1], size):
            group = x[:, start : start + size]
            n = group.shape[1]
            mask = self._mask(state.frames_out, n)
            per_channel = [
                self._run(group[b : b + 1].contiguous(), state, b, mask, state.frames_out % self.context)
                for b in range(len(state.channels))
            ]
            state.frames_out += n
            outs.append(_cat([r[0] for r in per_channel], 0))
            if return_competition:
                for i, store in enumerate(maps):
                    store.append(_cat([r[1 + i] for r in per_channel], 0))
        log_mag = _cat(outs, 1) if outs else x.new_zeros(x.shape[0], 0, self.n_bins)
        competition = [_cat(m, 1) for m in maps] if return_competition and outs else None
        return EnhancerOutput(log_mag, competition), state

    def run_frames(
        self,
        samples: np.ndarray,
        n: int,
        final: bool,
        state: FixedState,
        pending: np.ndarray,
        tail: np.ndarray,
        return_competition: bool = False,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """The engine's per-frame signal path around :meth:`step`, in NumPy (the contract of
        :meth:`enhance.native_backend.NativeStepper.run_frames`, which the engine takes when a backend has it):
        ``n`` new frames of ``samples`` [B, (n - 1) * hop + win] analysed, stepped, rebuilt with the noisy phase
        and overlap-added; ``pending`` [B, F] complex64 (the spectrum waiting for its lookahead frame) and
        ``tail`` [B, win - hop] float32 are updated in place. Returns the final samples [B, m * hop] of the m
        frames output and, with ``return_competition``, their competition scores [B, m, n_s] per TIM layer.
        The signal path of :mod:`enhance.stft` (equal to float32 rounding), at NumPy's cost per call instead of
        PyTorch's: around the step, a 16-ms hop is a dozen operations on 257-bin vectors, whose fixed cost per
        call is most of their time (0.87x the time per hop for onnxruntime-int8, session 30, bench/README.md,
        "The signal path in NumPy")."""
        hop, batch = self.hop, samples.shape[0]
        if n:
            x = np.ascontiguousarray(samples, np.float32)
            rows, step = x.strides
            frames = np.lib.stride_tricks.as_strided(
                x, (batch, n, 2 * hop), (rows, hop * step, step), writeable=False
            )
            spec = np.fft.rfft(frames * self.window, axis=-1).astype(np.complex64, copy=False)  # [B, n, F]
        else:
            spec = np.zeros((batch, 0, self.n_bins), np.complex64)
        mag = np.abs(spec)
        held = state.started  # frame 0 is held for its lookahead: the outputs then start with `pending`
        out, state = self.step(torch.from_numpy(np.log1p(mag)), state, final, return_competition)
        if held:
            spec = np.concatenate([pending[:, None], spec], axis=1)
            mag = np.concatenate([np.abs(pending)[:, None], mag], axis=1)
        log_mag = out.log_mag.numpy()
        m = log_mag.shape[1]
        if spec.shape[1] > m:
            pending[...] = spec[:, m]
        if not m:
            return np.zeros((batch, 0), np.float32), []
        # the noisy phase as the spectrum over its magnitude; a zero bin (digital silence) has phase 0
        spec, mag = spec[:, :m], mag[:, :m]
        phase = np.divide(spec, mag, out=np.ones_like(spec), where=mag > 0)
        rebuilt = np.expm1(np.maximum(log_mag, 0.0)) * phase
        frames = np.fft.irfft(rebuilt, n=2 * hop, axis=-1).astype(np.float32, copy=False) * self.window
        # overlap-add: each frame's first half plus the second half of the one before ([B, m, hop])
        wav = frames[..., :hop].copy()
        wav[:, 0] += tail
        wav[:, 1:] += frames[:, :-1, hop:]
        tail[...] = frames[:, -1, hop:]
        maps = [c.numpy() for c in out.competition] if return_competition and out.competition else []
        return wav.reshape(batch, m * hop), maps


def _cat(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """``torch.cat``, without its cost for the one part of a one-channel, one-frame hop."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def _db(limit: float | None) -> str:
    return "none" if limit is None else f"{limit:g} dB"


class TracedStepper(FixedStepper):
    """The step traced with TorchScript, frozen and optimised for inference (CPU, float32); any number of frames
    per call (tested equal for 1 ... ``max_frames``)."""

    max_frames = 64
    limit_baked_in = True

    def __init__(self, model: Enhancer, int8: bool = False) -> None:
        """``int8``: the pre-encoder's products with int8 weights (:mod:`enhance.torch_int8`; the
        ``torchscript-int8`` backend): faster per hop, not the same samples."""
        super().__init__(model)
        if int8:
            from enhance.torch_int8 import int8_pre_encoder

            traced_model = int8_pre_encoder(model)
        else:  # float32, without converting the caller's model
            traced_model = copy.deepcopy(model).float()
        step = StaticStep(traced_model).eval()
        # traced with 2 new frames: the number of frames per call stays free (sizes are traced, not baked in)
        example = [torch.zeros(1, 2, self.n_bins)] + [
            torch.zeros(s) for _, s in step.state_shapes(1, frames=2)
        ]
        with torch.no_grad():
            traced = torch.jit.trace(step, tuple(example), check_trace=False)
            self.module = torch.jit.optimize_for_inference(torch.jit.freeze(traced.eval()))
        self.names = ["feat"] + [name for name, _ in step.state_shapes(1)]

    def run(self, feed: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        with torch.inference_mode():
            return list(self.module(*(feed[n] for n in self.names)))
