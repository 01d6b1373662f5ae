"""Self-dependency units (Chai et al. 2020, "Highway Transformer"): content-based gates inside the residuals.

SDU:     h = norm(x + F(x) + psi(x W1 + b1) * (x W2 + b2))       psi = tanh or sigmoid
highway: h = norm(t * F(x) + (1 - t) * x),  t = sigmoid(x W1 + b1)

where F is the attention or FFN sub-layer and x its input. In TIM layers the gates are per-mechanism
(:class:`GroupLinear`), so mechanisms stay independent. Gates are per frame: no state, streaming unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from models.group_linear import GroupLinear

PSI = ("tanh", "sigmoid")


@dataclass(frozen=True)
class SDUConfig:
    psi: str = "sigmoid"  # the gate's squashing function
    attention: bool = True  # gate the attention sub-layer's residual
    ffn: bool = True  # gate the FFN sub-layer's residual
    highway: bool = False  # the paper's highway-gate variant instead of the additive SDU

    def __post_init__(self) -> None:
        if self.psi not in PSI:
            raise ValueError(f"psi must be one of {PSI}, got {self.psi!r}")
        if not (self.attention or self.ffn):
            raise ValueError("an SDU config must gate the attention or the FFN sub-layer (or both)")


class SDUGate(nn.Module):
    """Combines a sub-layer's input ``x`` and output ``y`` (both [..., G, d]) before the post-norm."""

    def __init__(self, n_groups: int, d: int, cfg: SDUConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.gate = GroupLinear(n_groups, d, d)
        self.value = None if cfg.highway else GroupLinear(n_groups, d, d)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.value is None:  # highway
            t = torch.sigmoid(self.gate(x))
            return t * y + (1.0 - t) * x
        g = torch.tanh(self.gate(x)) if self.cfg.psi == "tanh" else torch.sigmoid(self.gate(x))
        return x + y + g * self.value(x)
