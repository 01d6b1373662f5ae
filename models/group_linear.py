"""Per-mechanism ("group") linear maps and mechanism-wise LayerNorm, the two primitives of TIM layers.

A hidden state of width ``d_model`` is viewed as ``n_groups`` slices of ``d_model // n_groups``; each slice has its
own weights and never mixes with the others here (mixing is the inter-mechanism attention's job).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class GroupLinear(nn.Module):
    """``n_groups`` independent linear maps: ``[..., G, d_in] -> [..., G, d_out]``."""

    def __init__(self, n_groups: int, d_in: int, d_out: int, bias: bool = True) -> None:
        super().__init__()
        self.n_groups, self.d_in, self.d_out = n_groups, d_in, d_out
        self.weight = nn.Parameter(torch.empty(n_groups, d_in, d_out))
        self.bias = nn.Parameter(torch.empty(n_groups, d_out)) if bias else None
        bound = 1.0 / math.sqrt(d_in)  # nn.Linear's default initialisation, per group
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return group_linear(x, self.weight, self.bias, self.n_groups)

    def extra_repr(self) -> str:
        return f"n_groups={self.n_groups}, d_in={self.d_in}, d_out={self.d_out}, bias={self.bias is not None}"


def group_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, n_groups: int
) -> torch.Tensor:
    """``[..., G, d_in]`` through per-group ``weight`` [G, d_in, d_out] (and ``bias`` [G, d_out]). ``n_groups``
    is passed as a number so that tracing a weight computed in the graph (fused Q/K/V) does not branch on a shape."""
    g, d_in, d_out = n_groups, weight.shape[1], weight.shape[2]
    if g == 1:  # a plain linear map: one op instead of six (matters in per-frame streaming)
        return F.linear(x, weight[0].t(), None if bias is None else bias[0])
    lead = x.shape[:-2]
    flat = x.reshape(-1, g, d_in).transpose(0, 1)  # [G, N, d_in]
    out = torch.bmm(flat, weight).transpose(0, 1)  # [N, G, d_out]
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, g, d_out)


def fused_group_linear(x: torch.Tensor, maps: list[GroupLinear]) -> tuple[torch.Tensor, ...]:
    """Several :class:`GroupLinear` maps of the same input as one product with concatenated weights; returns their
    outputs in order. For traced/exported steps, where the concatenation of parameters folds into a constant: one
    call per frame instead of one per map. (A map without a bias gets zeros in the joint bias.)"""
    biases = [m.bias if m.bias is not None else m.weight.new_zeros(m.n_groups, m.d_out) for m in maps]
    bias = None if all(m.bias is None for m in maps) else torch.cat(biases, dim=-1)
    out = group_linear(x, torch.cat([m.weight for m in maps], dim=-1), bias, maps[0].n_groups)
    return out.split([m.d_out for m in maps], dim=-1)


class GroupLayerNorm(nn.Module):
    """LayerNorm of each mechanism's slice separately, with per-mechanism gain and bias: ``[..., G, d]``."""

    def __init__(self, n_groups: int, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.d, self.eps = d, eps
        self.weight = nn.Parameter(torch.ones(n_groups, d))
        self.bias = nn.Parameter(torch.zeros(n_groups, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.bias, F.layer_norm(x, (self.d,), None, None, self.eps), self.weight)
