"""An exponential moving average of a model's weights (``TrainConfig.ema_decay``), as Demucs and many speech
enhancement recipes train with: validation, ``best.safetensors`` and ``last.safetensors`` then hold the averaged
weights, which jitter less from step to step than the raw ones.

After each optimizer step, every floating-point tensor of the model's state dict moves toward the model's:
``average = d * average + (1 - d) * weight``. With ``warmup`` (a run from random weights), ``d = min(decay,
(1 + n) / (10 + n))`` at the n-th update (TensorFlow's ``num_updates``), so the random start does not dominate the
average for long; without it (a fine-tune from trained weights) ``d = decay`` from the first step. Integer buffers
are copied. The average is float64 on the model's device, so a long average of small steps loses nothing to
rounding, and its state (average and count) travels in ``state.pt`` for an exact ``--resume``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


class WeightEMA:
    """The moving average of ``model``'s weights, starting from its weights now; ``update`` after each step."""

    def __init__(self, model: torch.nn.Module, decay: float, warmup: bool) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"ema decay must be in (0, 1), got {decay}")
        self.decay, self.warmup = decay, warmup
        self.updates = 0
        self.average = {k: _average_of(v) for k, v in model.state_dict().items()}

    def current_decay(self) -> float:
        """The ``d`` the next update uses."""
        if not self.warmup:
            return self.decay
        return min(self.decay, (1.0 + self.updates) / (10.0 + self.updates))

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        d = self.current_decay()
        averages, weights = [], []
        for k, v in model.state_dict().items():
            a = self.average[k]
            if a.is_floating_point():
                averages.append(a)
                weights.append(v.detach().to(a.dtype))
            else:
                a.copy_(v)
        torch._foreach_mul_(averages, d)
        torch._foreach_add_(averages, weights, alpha=1.0 - d)
        self.updates += 1

    @contextmanager
    def applied(self, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """The model holding the averaged weights for the ``with`` block; its own weights are restored after,
        also when the block raises."""
        raw = {k: v.detach().clone() for k, v in model.state_dict().items()}
        try:
            model.load_state_dict({k: v.to(raw[k].dtype) for k, v in self.average.items()})
            yield model
        finally:
            model.load_state_dict(raw)

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "warmup": self.warmup, "updates": self.updates, "average": self.average}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copies a saved state into this average, which keeps its device and float64 (``state.pt`` is loaded
        onto the CPU); keys and shapes must match this model's."""
        saved = state["average"]
        if set(saved) != set(self.average) or any(saved[k].shape != a.shape for k, a in self.average.items()):
            raise ValueError("the saved weight average does not match this model's parameters")
        for k, a in self.average.items():
            a.copy_(saved[k])
        self.decay, self.warmup, self.updates = (
            float(state["decay"]),
            bool(state["warmup"]),
            int(state["updates"]),
        )


def _average_of(v: torch.Tensor) -> torch.Tensor:
    """The average's own copy of a state-dict tensor: float64 for floating-point ones, as is for the others."""
    v = v.detach()
    return v.to(torch.float64, copy=True) if v.is_floating_point() else v.clone()
