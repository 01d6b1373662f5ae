"""The TIM layer (Lamb et al. 2021, Algorithm 1): competing independent mechanisms.

The hidden state h [B, T, d] is split into ``n_s`` mechanisms of ``d / n_s`` each ([B, T, n_s, d/n_s]). In the
paper's order:

1. competition ``c = softmax_mechanisms(GroupLinear(h -> 1))`` per frame, [B, T, n_s];
2. position attention with per-mechanism Q/K/V/O, each mechanism attending within its own slice,
   ``h = norm(h + c * M)`` (TIM-NoComp: c = 1);
3. inter-mechanism attention: at each frame the mechanisms are the sequence (2 heads x 32 units),
   ``h = norm(h + M)``;
4. mechanism-wise FFN, ``h = norm(h + F)``.

"norm" is :class:`GroupLayerNorm` (each mechanism's slice normalised separately).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from models.attention import AttentionConfig, KVCache, MultiHeadAttention, StaticKV
from models.group_linear import GroupLayerNorm, GroupLinear, fused_group_linear
from models.mae import MAEConfig
from models.sdu import SDUConfig, SDUGate


@dataclass(frozen=True)
class TIMLayerConfig:
    attention: AttentionConfig = field(default_factory=lambda: AttentionConfig(n_groups=2))
    competition: bool = True  # False: TIM-NoComp (c = 1)
    d_ff: int = 512  # FFN inner width summed over mechanisms
    inter_heads: int = 2
    inter_head_dim: int = 32
    dropout: float = 0.1
    negative_slope: float = 0.01

    def __post_init__(self) -> None:
        if self.d_ff % self.n_mechanisms:
            raise ValueError(f"d_ff {self.d_ff} must divide by n_mechanisms {self.n_mechanisms}")

    @property
    def n_mechanisms(self) -> int:
        return self.attention.n_groups

    @property
    def d_model(self) -> int:
        return self.attention.d_model

    @property
    def d_mechanism(self) -> int:
        return self.d_model // self.n_mechanisms


class InterMechanismAttention(nn.Module):
    """Attention across mechanisms at each frame (no time mixing): [B, T, G, d_m] -> [B, T, G, d_m]."""

    def __init__(self, n_groups: int, d_group: int, n_heads: int, head_dim: int, dropout: float) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.dropout = n_heads, head_dim, dropout
        width = n_heads * head_dim
        self.q = GroupLinear(n_groups, d_group, width)
        self.k = GroupLinear(n_groups, d_group, width)
        self.v = GroupLinear(n_groups, d_group, width)
        self.o = GroupLinear(n_groups, width, d_group)

    def forward(self, h: torch.Tensor, fused: bool = False) -> torch.Tensor:
        """``fused``: Q, K and V as one product (see :func:`fused_group_linear`), for the traced/exported step."""
        b, t, g, _ = h.shape

        def heads(x: torch.Tensor) -> torch.Tensor:
            # [B, T, G, H*Dh] -> [B, T, H, G, Dh]: the mechanisms are the attention sequence
            return x.reshape(b, t, g, self.n_heads, self.head_dim).transpose(2, 3)

        if fused and not self.training:
            q, k, v = (heads(x) for x in fused_group_linear(h, [self.q, self.k, self.v]))
        else:
            q, k, v = heads(self.q(h)), heads(self.k(h)), heads(self.v(h))
        if self.training:  # SDPA, as before: the same random draws, so runs resume exactly across versions
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout)
        else:  # written out: on n_s (2-4) mechanisms SDPA's CPU path costs ~100 us a call, a fifth of a stream step
            y = torch.matmul(torch.softmax(torch.matmul(q * self.head_dim**-0.5, k.transpose(-1, -2)), -1), v)
        return self.o(y.transpose(2, 3).reshape(b, t, g, self.n_heads * self.head_dim))


class TIMLayer(nn.Module):
    def __init__(
        self, cfg: TIMLayerConfig, sdu: SDUConfig | None = None, mae: MAEConfig | None = None
    ) -> None:
        super().__init__()
        self.cfg = cfg
        g, dm = cfg.n_mechanisms, cfg.d_mechanism
        # optional self-dependency gates (per mechanism) on the position-attention and FFN residuals
        self.sdu_attn = SDUGate(g, dm, sdu) if sdu is not None and sdu.attention else None
        self.sdu_ffn = SDUGate(g, dm, sdu) if sdu is not None and sdu.ffn else None
        self.score = GroupLinear(g, dm, 1) if cfg.competition else None
        self.attn = MultiHeadAttention(cfg.attention, mae)  # MAE: one gate per mechanism
        self.norm1 = GroupLayerNorm(g, dm)
        self.inter = InterMechanismAttention(g, dm, cfg.inter_heads, cfg.inter_head_dim, cfg.dropout)
        self.norm2 = GroupLayerNorm(g, dm)
        d_ff_m = cfg.d_ff // g
        self.ffn_in = GroupLinear(g, dm, d_ff_m)
        self.ffn_out = GroupLinear(g, d_ff_m, dm)
        self.act = nn.LeakyReLU(cfg.negative_slope)
        self.norm3 = GroupLayerNorm(g, dm)
        self.drop = nn.Dropout(cfg.dropout)

    def competition(self, h: torch.Tensor) -> torch.Tensor | None:
        """Competition scores [B, T, n_s] (sum to 1 over mechanisms), or None for TIM-NoComp."""
        if self.score is None:
            return None
        return torch.softmax(self.score(h).squeeze(-1), dim=-1)

    def forward(
        self, x: torch.Tensor, cache: KVCache | StaticKV | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, KVCache | StaticKV | None]:
        b, t, d = x.shape
        h = x.reshape(b, t, self.cfg.n_mechanisms, self.cfg.d_mechanism)  # [B, T, G, d_m]
        static = isinstance(cache, StaticKV)
        if static and self.score is not None:  # traced/exported step: the score joins the Q/K/V product
            score, *qkv = self.attn.fused_qkv(h, before=self.score)
            c: torch.Tensor | None = torch.softmax(score.squeeze(-1), dim=-1)
            m, cache = self.attn(h, cache, qkv=tuple(qkv))
        else:
            c = self.competition(h)
            m, cache = self.attn(h, cache)
        if c is not None:
            m = m * c.unsqueeze(-1)
        m = self.drop(m)
        h = self.norm1(h + m if self.sdu_attn is None else self.sdu_attn(h, m))
        h = self.norm2(h + self.drop(self.inter(h, fused=static)))
        f = self.drop(self.ffn_out(self.drop(self.act(self.ffn_in(h)))))
        h = self.norm3(h + f if self.sdu_ffn is None else self.sdu_ffn(h, f))
        return h.reshape(b, t, d), c, cache
