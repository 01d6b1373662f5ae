"""Block-coordinate descent (BCD) for mixture-of-attentive-experts models (Peng et al. 2020).

Training alternates two kinds of step, by the global step number (so ``--resume`` continues the same schedule):

* G step: the full mixture forward; only the MAE gates are updated.
* F step: each example's attention uses one expert sampled from the gate (see :class:`models.mae.MAEGate`);
  only the experts (every parameter but the gates) are updated.

Frozen parameters get no gradient (``grad = None``), and Adam skips a parameter without a gradient entirely, so
its weights and moments stay exactly as they were (tested). One optimizer and one checkpoint format serve both.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from models.mae import gate_parameter_names, set_mae_mode


@dataclass(frozen=True)
class BCDConfig:
    g_steps: int = 1  # gate steps per cycle
    f_steps: int = 1  # expert steps per cycle

    def __post_init__(self) -> None:
        if self.g_steps < 1 or self.f_steps < 1:
            raise ValueError("BCD needs g_steps >= 1 and f_steps >= 1")

    def phase(self, global_step: int) -> str:
        """``"G"`` or ``"F"`` for the step numbered ``global_step`` (0-based): G steps first in each cycle."""
        return "G" if global_step % (self.g_steps + self.f_steps) < self.g_steps else "F"


class BCD:
    """Applies a :class:`BCDConfig` to one model: :meth:`before_forward`, then :meth:`after_backward`."""

    def __init__(self, model: nn.Module, cfg: BCDConfig) -> None:
        self.cfg = cfg
        self.gate_names = gate_parameter_names(model)
        if not self.gate_names:
            raise ValueError("BCD training needs a model with MAE gates (e.g. tim+mae)")
        self.model = model

    def before_forward(self, global_step: int) -> str:
        phase = self.cfg.phase(global_step)
        set_mae_mode(self.model, "mixture" if phase == "G" else "sample")
        return phase

    def after_backward(self, phase: str) -> None:
        """Drop the gradients of what this phase freezes, and put the model back in mixture mode."""
        for name, p in self.model.named_parameters():
            if (name in self.gate_names) != (phase == "G"):
                p.grad = None
        set_mae_mode(self.model, "mixture")
