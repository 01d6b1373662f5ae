"""The incremental step in fixed-shape form, for export (ONNX): one feature frame in, one output frame out.

State tensors, all of fixed shape (B = 1: the host runs each channel on its own):

    conv_i   [B, C_in_i, kernel_size - 1]   last inputs of pre-encoder conv i (conv 0: the last two feature frames)
    valid    [context_frames] bool          which ring slots are filled (False at the start of a stream)
    k_j      [B, H, Dh, context_frames]     keys of block j's attention, stored transposed (a contiguous q @ K):
                                            a ring buffer, any slot order
    v_j      [B, H, context_frames, Dh]     values of the same frames, same slots
    u_j      [B, G, context_frames, d/G]    MAE blocks only: the gate's input of the same frames

Outputs: the log magnitude, the competition maps, the new conv caches, and this frame's ``k_j`` ``[B, H, Dh, 1]``,
``v_j`` ``[B, H, 1, Dh]`` (``u_j`` ``[B, G, 1, d/G]``), which the host writes into the ring's oldest slot (the step
only reads the ring: no copies). Each pre-encoder conv is one matrix product over its k-frame window.

Frame t in gives output frame t - 1 (the lookahead). The host (``enhance.onnx_backend``) does what does not fit
fixed shapes: it only stores frame 0 (nothing to output yet), and at the end feeds one zero feature frame, which
is exactly the zero padding of the offline path (log1p|0| = 0). Same numbers as :meth:`Enhancer.forward`.
"""

from __future__ import annotations

import torch
from torch import nn

from models.attention import StaticKV
from models.encoder_layer import StandardLayer
from models.enhancer import Enhancer
from models.pre_encoder import ConvBlock
from models.tim_layer import TIMLayer


class StaticStep(nn.Module):
    def __init__(self, model: Enhancer) -> None:
        super().__init__()
        self.model = model
        self.n_conv = len(model.pre_encoder.blocks)
        self.n_layers = len(model.layers)

    def state_shapes(self, batch: int) -> list[tuple[str, tuple[int, ...]]]:
        cfg = self.model.cfg
        k = cfg.pre_encoder.kernel_size
        dims = (cfg.pre_encoder.n_bins, *cfg.pre_encoder.channels)
        shapes: list[tuple[str, tuple[int, ...]]] = [
            (f"conv_{i}", (batch, dims[i], k - 1)) for i in range(self.n_conv)
        ]
        shapes.append(("valid", (cfg.context_frames,)))
        for j, layer in enumerate(self.model.layers):
            assert isinstance(layer, StandardLayer | TIMLayer)
            a = layer.attn.cfg
            shapes += [(f"k_{j}", (batch, a.n_heads, a.head_dim, a.context_frames))]
            shapes += [(f"v_{j}", (batch, a.n_heads, a.context_frames, a.head_dim))]
            if layer.attn.mae is not None:
                shapes += [(f"u_{j}", (batch, a.n_groups, a.context_frames, a.d_model // a.n_groups))]
        return shapes

    def forward(self, feat: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """feat [B, 1, F] and the state -> (log_mag [B, 1, F], competition maps [B, 1, n_s]..., new conv caches...,
        this frame's k, v (u) per block...)."""
        convs, valid, kv = list(state[: self.n_conv]), state[self.n_conv], state[self.n_conv + 1 :]
        previous = convs[0][:, :, -1:].transpose(1, 2)  # feature frame t - 1: the residual's input
        new_convs = []
        h = feat  # [B, 1, C]
        for block, cache in zip(self.model.pre_encoder.blocks, convs, strict=True):
            assert isinstance(block, ConvBlock)
            window = torch.cat([cache, h.transpose(1, 2)], dim=-1)  # [B, C_in, k]
            new_convs.append(window[:, :, 1:])
            h = block.one_frame(window)
        maps, new_kv = [], []
        caches = iter(kv)
        for layer in self.model.layers:
            assert isinstance(layer, StandardLayer | TIMLayer)
            k, v = next(caches), next(caches)
            u = next(caches) if layer.attn.mae is not None else None
            h, c, cache = layer(h, StaticKV(k, v, valid, u))
            assert isinstance(cache, StaticKV)
            new_kv += [cache.k, cache.v] if cache.u is None else [cache.k, cache.v, cache.u]
            if c is not None:
                maps.append(c)
        log_mag = self.model.output_stage(previous, h)
        return (log_mag, *maps, *new_convs, *new_kv)
