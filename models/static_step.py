"""The incremental step in fixed-shape form, for tracing (TorchScript) and export (ONNX): T feature frames in,
T output frames out.

State tensors (B = 1: the host runs each channel on its own; C = ``context_frames``):

    conv_i   [B, C_in_i, kernel_size - 1]   last inputs of pre-encoder conv i (conv 0: the last two feature frames)
    mask     [T, C + T] float               what each new frame may see, added to the attention scores (0: seen,
                                            -inf: not): ring slots that are filled and within its context, then
                                            the new frames up to itself (the host computes it)
    k_j      [B, H, Dh, C]                  keys of block j's attention, stored transposed (a contiguous q @ K):
                                            a ring buffer, any slot order
    v_j      [B, H, C, Dh]                  values of the same frames, same slots
    u_j      [B, G, C, d/G]                 MAE blocks only: the gate's input of the same frames

Outputs: the log magnitude [B, T, F], the competition maps [B, T, n_s], the new conv caches, and the new frames'
``k_j`` ``[B, H, Dh, T]``, ``v_j`` ``[B, H, T, Dh]`` (``u_j`` ``[B, G, T, d/G]``), which the host writes into the
ring's T oldest slots (the step only reads the ring: no copies). Each pre-encoder conv is one matrix product over
its windows of k frames.

Frames t ... t + T - 1 in give output frames t - 1 ... t + T - 2 (the lookahead). The host
(:mod:`enhance.fixed_step`) does what does not fit fixed shapes: it only stores frame 0 (nothing to output yet),
and at the end feeds one zero feature frame, which is exactly the zero padding of the offline path
(log1p|0| = 0). Same numbers as :meth:`Enhancer.forward`. T is free in the ONNX export and in the
TorchScript trace.
"""

from __future__ import annotations

import torch
from torch import nn

from models.attention import StaticKV
from models.encoder_layer import StandardLayer
from models.enhancer import Enhancer
from models.pre_encoder import ConvBlock
from models.tim_layer import TIMLayer


def slot_axis(name: str) -> int:
    """The axis along which the ring buffer ``name`` holds its frames (and the step returns its new frames):
    3 for keys, stored transposed [B, H, Dh, C]; 2 for values and MAE gate inputs [B, *, C, *]."""
    return 3 if name.startswith("k_") else 2


def unsupported(model: Enhancer) -> str | None:
    """Why the fixed-shape step cannot run ``model`` (None: it can): it keeps a ring of ``context_frames`` >= 1
    slots and is written for a lookahead of one frame."""
    if model.cfg.context_frames < 1:
        return "the fixed-shape step needs context_frames >= 1"
    if model.cfg.lookahead_frames != 1:
        return "the fixed-shape step is written for a lookahead of one frame"
    return None


class StaticStep(nn.Module):
    def __init__(self, model: Enhancer) -> None:
        super().__init__()
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"{reason}; use the PyTorch backend")
        self.model = model
        self.n_conv = len(model.pre_encoder.blocks)
        self.n_layers = len(model.layers)

    def state_shapes(self, batch: int, frames: int = 1) -> list[tuple[str, tuple[int, ...]]]:
        """Names and shapes of the state inputs for a step of ``frames`` new frames."""
        cfg = self.model.cfg
        k = cfg.pre_encoder.kernel_size
        dims = (cfg.pre_encoder.n_bins, *cfg.pre_encoder.channels)
        shapes: list[tuple[str, tuple[int, ...]]] = [
            (f"conv_{i}", (batch, dims[i], k - 1)) for i in range(self.n_conv)
        ]
        shapes.append(("mask", (frames, cfg.context_frames + frames)))
        for j, layer in enumerate(self.model.layers):
            assert isinstance(layer, StandardLayer | TIMLayer)
            a = layer.attn.cfg
            shapes += [(f"k_{j}", (batch, a.n_heads, a.head_dim, a.context_frames))]
            shapes += [(f"v_{j}", (batch, a.n_heads, a.context_frames, a.head_dim))]
            if layer.attn.mae is not None:
                shapes += [(f"u_{j}", (batch, a.n_groups, a.context_frames, a.d_model // a.n_groups))]
        return shapes

    def forward(self, feat: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """feat [B, T, F] and the state -> (log_mag [B, T, F], competition maps [B, T, n_s]..., new conv caches...,
        the new frames' k, v (u) per block...)."""
        convs, mask, kv = list(state[: self.n_conv]), state[self.n_conv], state[self.n_conv + 1 :]
        k = self.model.cfg.pre_encoder.kernel_size
        new_convs = []
        h = feat  # [B, T, C]
        previous = feat  # feature frames t - 1 ...: the output stage's residual input (set at conv 0)
        for i, (block, cache) in enumerate(zip(self.model.pre_encoder.blocks, convs, strict=True)):
            assert isinstance(block, ConvBlock)
            window = torch.cat([cache, h.transpose(1, 2)], dim=-1)  # [B, C_in, k - 1 + T]
            if i == 0:
                previous = window[:, :, k - 2 : -1].transpose(1, 2)  # [B, T, F]
            new_convs.append(window[:, :, -(k - 1) :])
            h = block.frames(window)  # [B, T, C_out]
        maps, new_kv = [], []
        caches = iter(kv)
        for layer in self.model.layers:
            assert isinstance(layer, StandardLayer | TIMLayer)
            keys, values = next(caches), next(caches)
            u = next(caches) if layer.attn.mae is not None else None
            h, c, cache = layer(h, StaticKV(keys, values, mask, u))
            assert isinstance(cache, StaticKV)
            new_kv += [cache.k, cache.v] if cache.u is None else [cache.k, cache.v, cache.u]
            if c is not None:
                maps.append(c)
        log_mag = self.model.output_stage(previous, h)
        return (log_mag, *maps, *new_convs, *new_kv)
