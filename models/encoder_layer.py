"""The standard Transformer encoder layer (blocks 1, 2 and 8): post-norm, LeakyReLU FFN, banded causal MHA."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from models.attention import AttentionConfig, KVCache, MultiHeadAttention, StaticKV
from models.mae import MAEConfig
from models.sdu import SDUConfig, SDUGate


@dataclass(frozen=True)
class StandardLayerConfig:
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    d_ff: int = 256
    dropout: float = 0.1
    negative_slope: float = 0.01

    def __post_init__(self) -> None:
        if self.attention.n_groups != 1:
            raise ValueError("a standard layer's attention has n_groups == 1")

    @property
    def d_model(self) -> int:
        return self.attention.d_model


class StandardLayer(nn.Module):
    def __init__(
        self, cfg: StandardLayerConfig, sdu: SDUConfig | None = None, mae: MAEConfig | None = None
    ) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.sdu_attn = SDUGate(1, d, sdu) if sdu is not None and sdu.attention else None
        self.sdu_ffn = SDUGate(1, d, sdu) if sdu is not None and sdu.ffn else None
        self.attn = MultiHeadAttention(cfg.attention, mae)
        self.norm1 = nn.LayerNorm(d)
        self.ffn = nn.Sequential(
            nn.Linear(d, cfg.d_ff),
            nn.LeakyReLU(cfg.negative_slope),
            nn.Dropout(cfg.dropout),
            nn.Linear(cfg.d_ff, d),
        )
        self.norm2 = nn.LayerNorm(d)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(
        self, h: torch.Tensor, cache: KVCache | StaticKV | None = None
    ) -> tuple[torch.Tensor, None, KVCache | StaticKV | None]:
        # h: [B, T, d]; returns (h, competition=None, attention cache) like TIMLayer
        a, cache = self.attn(h.unsqueeze(2), cache)
        h = self.norm1(_residual(self.sdu_attn, h, self.drop(a.squeeze(2))))
        h = self.norm2(_residual(self.sdu_ffn, h, self.drop(self.ffn(h))))
        return h, None, cache


def _residual(gate: SDUGate | None, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y, or the SDU/highway combination of a [B, T, d] input and sub-layer output."""
    if gate is None:
        return x + y
    return gate(x.unsqueeze(2), y.unsqueeze(2)).squeeze(2)
