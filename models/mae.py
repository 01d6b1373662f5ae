"""Mixture of attentive experts (Peng et al. 2020, "A Mixture of h-1 Heads is Better than h Heads").

Multi-head attention is ``sum_j O_j(y_j)`` over heads j. Expert i is every head but i, rescaled:
``f_i = H/(H-1) * sum_{j != i} O_j(y_j)``. A gate ``g`` (softmax over the H experts) mixes them, and

    sum_i g_i f_i = sum_j w_j O_j(y_j),   w_j = H/(H-1) * (1 - g_j)

so the mixture is one attention whose heads are weighted by ``w`` before the output projection: no extra
attention cost, and ``w = 1`` (a uniform gate) is plain multi-head attention.

The gate is the paper's two-layer tanh MLP and softmax on the mean of the layer's input over time. The paper
averages over the whole sentence, which would let frame t see the future; here frame t averages the frames its
attention sees (``t - context_frames ... t``), so the model stays causal and streaming keeps those frames in its
attention cache (tested equal to offline).

In TIM layers, whose heads are split among mechanisms, each mechanism has its own gate over its own heads
(GroupLinear weights), so mechanisms stay independent; with one group this is exactly the paper's layer.

Block-coordinate descent (``recipes`` trainer option ``mae_training="bcd"``): G steps train only the gates with
the full mixture; F steps sample one expert per example (per layer and mechanism) from the gate and train only
the experts (every other parameter). :func:`set_mae_mode` switches the layers between the two forwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from models.group_linear import GroupLinear

MODES = ("mixture", "sample")


@dataclass(frozen=True)
class MAEConfig:
    hidden: int = 64  # gate MLP width (summed over mechanisms in TIM layers)

    def __post_init__(self) -> None:
        if self.hidden < 1:
            raise ValueError("MAE gate hidden width must be >= 1")


def windowed_mean(u: torch.Tensor, n_queries: int, context_frames: int) -> torch.Tensor:
    """Causal windowed mean of ``u`` [B, G, n, d] along frames, for the last ``n_queries`` frames.

    Query frame q averages frames ``max(first, q - context_frames) ... q``: with ``u`` the whole sequence that is
    the offline gate input; with ``u`` a cache view (the last ``context_frames`` frames before the queries, then
    the queries) it is the same numbers. Sums in float64 so long files lose nothing to cancellation.
    """
    n = u.shape[2]
    zero = u.new_zeros(*u.shape[:2], 1, u.shape[3], dtype=torch.float64)
    cs = torch.cat([zero, torch.cumsum(u.to(torch.float64), dim=2)], dim=2)  # cs[i] = sum of frames < i
    q = torch.arange(n - n_queries, n, device=u.device)
    lo = (q - context_frames).clamp(min=0)
    total = cs[:, :, q + 1] - cs[:, :, lo]
    count = (q + 1 - lo).to(torch.float64).view(1, 1, -1, 1)
    return (total / count).to(u.dtype)


class MAEGate(nn.Module):
    """Per-frame head weights ``w`` [B, H, T, 1] from the windowed mean of the attention's input."""

    def __init__(self, n_groups: int, d_group: int, heads_per_group: int, cfg: MAEConfig) -> None:
        super().__init__()
        if heads_per_group < 2:
            raise ValueError(f"MAE needs at least 2 heads per mechanism, got {heads_per_group}")
        if cfg.hidden % n_groups:
            raise ValueError(f"MAE hidden {cfg.hidden} must divide by the {n_groups} mechanisms")
        self.n_groups, self.heads_per_group = n_groups, heads_per_group
        self.fc1 = GroupLinear(n_groups, d_group, cfg.hidden // n_groups)
        self.fc2 = GroupLinear(n_groups, cfg.hidden // n_groups, heads_per_group)
        self.mode = "mixture"  # or "sample": BCD's F step (set with set_mae_mode)

    def gate(self, mean: torch.Tensor) -> torch.Tensor:
        """``mean`` [B, G, T, d_g] -> expert probabilities [B, T, G, H/G] (sum to 1 per mechanism)."""
        return torch.softmax(self.fc2(torch.tanh(self.fc1(mean.transpose(1, 2)))), dim=-1)

    def forward(self, mean: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = mean.shape
        hg = self.heads_per_group
        if self.mode == "sample":
            with torch.no_grad():  # the gate only picks; F steps train the experts
                g = self.gate(mean).mean(dim=1)  # [B, G, Hg]: one draw per example and mechanism
                pick = torch.multinomial(g.reshape(-1, hg), 1).view(b, self.n_groups, 1)
                drop = torch.zeros_like(g).scatter_(-1, pick, 1.0).unsqueeze(1)  # [B, 1, G, Hg]
            w = (hg / (hg - 1)) * (1.0 - drop.expand(b, t, -1, -1))
        else:
            w = (hg / (hg - 1)) * (1.0 - self.gate(mean))  # [B, T, G, Hg]
        # heads of mechanism g are g*Hg ... (g+1)*Hg - 1 (see MultiHeadAttention._heads)
        return w.reshape(b, t, self.n_groups * hg).transpose(1, 2).unsqueeze(-1)


def mae_gates(model: nn.Module) -> Iterator[MAEGate]:
    return (m for m in model.modules() if isinstance(m, MAEGate))


def set_mae_mode(model: nn.Module, mode: str) -> None:
    """``"mixture"`` (inference, G steps) or ``"sample"`` (F steps: one sampled expert per example)."""
    if mode not in MODES:
        raise ValueError(f"MAE mode must be one of {MODES}, got {mode!r}")
    for gate in mae_gates(model):
        gate.mode = mode


def gate_parameter_names(model: nn.Module) -> set[str]:
    """Names (as in ``model.named_parameters()``) of every MAE gate parameter: what G steps train."""
    prefixes = [name + "." for name, m in model.named_modules() if isinstance(m, MAEGate)]
    return {n for n, _ in model.named_parameters() if any(n.startswith(p) for p in prefixes)}
