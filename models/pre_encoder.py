"""Causal 1-D convolutional pre-encoder (replaces positional encoding, Lamb et al. 2021 appendix A.2).

Conv1d 257 -> 1024 -> 512 -> 128 -> 256 over frames, kernel 3, each followed by LayerNorm over channels and
LeakyReLU. All convolutions are causal except the first, which spends the model's whole lookahead
(``lookahead_frames`` future frames, default 1 = one 16 ms hop, i.e. the "32 ms lookahead" of the paper).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class PreEncoderConfig:
    n_bins: int = 257
    channels: tuple[int, ...] = (1024, 512, 128, 256)
    kernel_size: int = 3
    lookahead_frames: int = 1
    negative_slope: float = 0.01

    def __post_init__(self) -> None:
        if not 0 <= self.lookahead_frames <= self.kernel_size - 1:
            raise ValueError(f"lookahead_frames must be in [0, kernel_size - 1 = {self.kernel_size - 1}]")

    @property
    def d_model(self) -> int:
        return self.channels[-1]

    def padding(self, layer: int) -> tuple[int, int]:
        """(past, future) frames of zero padding of conv ``layer``; layer 0 spends the lookahead."""
        future = self.lookahead_frames if layer == 0 else 0
        return self.kernel_size - 1 - future, future

    @property
    def past_frames(self) -> int:
        """How many past frames one output frame depends on (receptive field, past side)."""
        return sum(self.padding(i)[0] for i in range(len(self.channels)))


class ConvBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel_size: int, pad: tuple[int, int], slope: float) -> None:
        super().__init__()
        self.pad = pad
        self.conv = nn.Conv1d(c_in, c_out, kernel_size)
        self.norm = nn.LayerNorm(c_out)
        self.act = nn.LeakyReLU(slope)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, C_in, T] -> [B, C_out, T]
        return self.unpadded(F.pad(x, self.pad))

    def unpadded(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C_in, T + k - 1] (context included) -> [B, C_out, T]."""
        k = self.conv.kernel_size[0]
        if x.shape[-1] - k + 1 <= 4:  # a few frames (streaming): one matmul beats the conv kernels' overhead
            return self.frames(x).transpose(1, 2)
        y = self.norm(self.conv(x).transpose(1, 2)).transpose(1, 2)  # LayerNorm over channels, per frame
        return self.act(y)

    def frames(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C_in, T + k - 1] -> [B, T, C_out] (frames last): one matrix product of the T windows of k frames,
        flattened in the weight's order. Fastest for a few frames, and the form the fixed-shape step exports."""
        return self.act(self.norm(F.linear(self.windows(x), self.conv.weight.flatten(1), self.conv.bias)))

    def windows(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C_in, T + k - 1] -> [B, T, C_in * k]: the T windows of k frames, flattened in the weight's order."""
        k = self.conv.kernel_size[0]
        # slices with constant ends (not unfold, which the ONNX exporter shapes wrongly, nor T, which a trace
        # would bake in)
        shifted = [x[..., j : j - (k - 1)] if j < k - 1 else x[..., j:] for j in range(k)]
        return torch.stack(shifted, dim=-1).transpose(1, 2).flatten(2)


class PreEncoder(nn.Module):
    def __init__(self, cfg: PreEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        dims = (cfg.n_bins, *cfg.channels)
        self.blocks = nn.ModuleList(
            ConvBlock(dims[i], dims[i + 1], cfg.kernel_size, cfg.padding(i), cfg.negative_slope)
            for i in range(len(cfg.channels))
        )

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        x = feats.transpose(1, 2)  # [B, T, F] -> [B, F, T]
        for block in self.blocks:
            x = block(x)
        return x.transpose(1, 2)  # [B, T, d_model]

    def step(
        self, feats: torch.Tensor, caches: list[torch.Tensor] | None, final: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Incremental forward: new frames [B, n, F] -> the outputs they complete [B, m, d_model].

        ``caches[i]`` holds the last ``kernel_size - 1`` inputs of conv i (its left zero padding at the start).
        Conv 0 waits ``lookahead_frames`` frames for its future context; ``final`` feeds it the zero frames that
        the offline path pads the end with. Outputs: m = n - lookahead at the first call, then n.
        """
        x = feats.transpose(1, 2)  # [B, F, n]
        k = self.cfg.kernel_size
        new_caches = []
        for i, block in enumerate(self.blocks):
            assert isinstance(block, ConvBlock)
            past, future = self.cfg.padding(i)
            cache = caches[i] if caches is not None else x.new_zeros(x.shape[0], x.shape[1], past)
            if final and future:
                x = F.pad(x, (0, future))
            full = torch.cat([cache, x], dim=-1)
            new_caches.append(full[..., max(0, full.shape[-1] - (k - 1)) :])
            if full.shape[-1] < k:
                x = full.new_zeros(full.shape[0], block.conv.out_channels, 0)
            else:
                x = block.unpadded(full)
        return x.transpose(1, 2), new_caches
