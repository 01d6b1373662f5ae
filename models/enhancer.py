"""The full enhancer: noisy log1p magnitude [B, T, 257] -> clean log1p magnitude [B, T, 257].

    features -> PreEncoder (causal convs, spends the lookahead) -> blocks 1..8 (standard or TIM) -> Linear -> softplus

Output frame t depends on input frames ``t - receptive_past ... t + lookahead`` only (tested).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from enhance.stft import STFTConfig
from models.encoder_layer import StandardLayer, StandardLayerConfig
from models.pre_encoder import PreEncoder, PreEncoderConfig
from models.tim_layer import TIMLayer, TIMLayerConfig

OUTPUT_MODES = ("direct", "residual")


@dataclass(frozen=True)
class EnhancerConfig:
    stft: STFTConfig = field(default_factory=STFTConfig)
    pre_encoder: PreEncoderConfig = field(default_factory=PreEncoderConfig)
    standard: StandardLayerConfig = field(default_factory=StandardLayerConfig)
    tim: TIMLayerConfig | None = None
    n_layers: int = 8
    tim_blocks: tuple[int, ...] = ()  # 1-based block numbers that are TIM layers (paper: 3..7)
    # "direct": softplus(head(h)), the paper's mapping; "residual": relu(noisy + head(h)), the same target
    # reached from the identity (converges much faster, see README). Default "direct" = what configs without
    # this key meant.
    output: str = "direct"

    def __post_init__(self) -> None:
        if self.output not in OUTPUT_MODES:
            raise ValueError(f"output must be one of {OUTPUT_MODES}, got {self.output!r}")
        if self.pre_encoder.n_bins != self.stft.n_bins:
            raise ValueError(f"pre_encoder.n_bins {self.pre_encoder.n_bins} != STFT bins {self.stft.n_bins}")
        if self.standard.d_model != self.pre_encoder.d_model:
            raise ValueError("standard layers' d_model must equal the pre-encoder's output width")
        if self.tim_blocks:
            if self.tim is None:
                raise ValueError("tim_blocks given but no tim layer config")
            if self.tim.d_model != self.pre_encoder.d_model:
                raise ValueError("TIM layers' d_model must equal the pre-encoder's output width")
            if self.tim.attention.context_frames != self.standard.attention.context_frames:
                raise ValueError("all layers must share context_frames")
            if not all(1 <= b <= self.n_layers for b in self.tim_blocks):
                raise ValueError(f"tim_blocks {self.tim_blocks} outside 1..{self.n_layers}")

    @property
    def d_model(self) -> int:
        return self.pre_encoder.d_model

    @property
    def context_frames(self) -> int:
        return self.standard.attention.context_frames

    @property
    def lookahead_frames(self) -> int:
        return self.pre_encoder.lookahead_frames

    @property
    def receptive_past_frames(self) -> int:
        """Past input frames that can influence an output frame (convs + one attention context per layer)."""
        return self.pre_encoder.past_frames + self.n_layers * self.context_frames

    @property
    def n_mechanisms(self) -> int:
        return self.tim.n_mechanisms if (self.tim is not None and self.tim_blocks) else 1


@dataclass
class EnhancerOutput:
    log_mag: torch.Tensor  # [B, T, n_bins], predicted clean log1p magnitude (>= 0)
    # one [B, T, n_s] tensor per TIM layer with competition, in block order (None unless asked for)
    competition: list[torch.Tensor] | None = None


class Enhancer(nn.Module):
    def __init__(self, cfg: EnhancerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.pre_encoder = PreEncoder(cfg.pre_encoder)
        layers: list[nn.Module] = []
        for block in range(1, cfg.n_layers + 1):
            if block in cfg.tim_blocks:
                assert cfg.tim is not None
                layers.append(TIMLayer(cfg.tim))
            else:
                layers.append(StandardLayer(cfg.standard))
        self.layers = nn.ModuleList(layers)
        self.head = nn.Linear(cfg.d_model, cfg.pre_encoder.n_bins)

    @property
    def competition_blocks(self) -> list[int]:
        """1-based numbers of the blocks whose competition maps :meth:`forward` returns."""
        return [
            i + 1
            for i, layer in enumerate(self.layers)
            if isinstance(layer, TIMLayer) and layer.score is not None
        ]

    def forward(self, feats: torch.Tensor, return_competition: bool = False) -> EnhancerOutput:
        if feats.ndim != 3 or feats.shape[-1] != self.cfg.pre_encoder.n_bins:
            raise ValueError(
                f"expected features [B, T, {self.cfg.pre_encoder.n_bins}], got {tuple(feats.shape)}"
            )
        if feats.shape[1] == 0:
            raise ValueError("expected at least one frame")
        h = self.pre_encoder(feats)  # [B, T, d_model]
        maps: list[torch.Tensor] = []
        for layer in self.layers:
            h, c = layer(h)
            if c is not None:
                maps.append(c)
        if self.cfg.output == "residual":
            log_mag = F.relu(feats + self.head(h))  # non-negative, like log1p(|X|)
        else:
            log_mag = F.softplus(self.head(h))
        return EnhancerOutput(log_mag, maps if return_competition else None)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
