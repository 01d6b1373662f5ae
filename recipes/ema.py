"""An exponential moving average of a model's weights (``TrainConfig.ema_decay``), as Demucs and many speech
enhancement recipes train with: validation, ``best.safetensors`` and ``last.safetensors`` then hold the averaged
weights, which jitter less from step to step than the raw ones.

After each optimizer step, every floating-point tensor of the model's state dict moves toward the model's:
``shadow = d * shadow + (1 - d) * weight``, with ``d = min(decay, (1 + n) / (10 + n))`` at the n-th update, so the
average of a run from random weights is not dominated by them for long (TensorFlow's ``num_updates`` warm-up).
Integer buffers are copied. The shadow is float64, so a long average of small steps loses nothing to rounding, and
its state (shadow and count) travels in ``state.pt`` for an exact ``--resume``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


class WeightEMA:
    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"ema decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.updates = 0
        self.shadow = {k: _copy(v) for k, v in model.state_dict().items()}

    def current_decay(self) -> float:
        return min(self.decay, (1.0 + self.updates) / (10.0 + self.updates))

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        d = self.current_decay()
        for k, v in model.state_dict().items():
            s = self.shadow[k]
            if s.is_floating_point():
                s.mul_(d).add_(v.detach().to(s.dtype), alpha=1.0 - d)
            else:
                s.copy_(v)
        self.updates += 1

    @contextmanager
    def applied(self, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """The model holding the averaged weights for the ``with`` block; its own weights are restored after."""
        raw = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict({k: v.to(raw[k].dtype) for k, v in self.shadow.items()})
        try:
            yield model
        finally:
            model.load_state_dict(raw)

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "updates": self.updates, "shadow": self.shadow}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state["shadow"]) != set(self.shadow):
            raise ValueError("the saved weight average does not match this model's parameters")
        self.decay = float(state["decay"])
        self.updates = int(state["updates"])
        self.shadow = {k: v.detach().clone() for k, v in state["shadow"].items()}


def _copy(v: torch.Tensor) -> torch.Tensor:
    v = v.detach()
    return v.to(torch.float64, copy=True) if v.is_floating_point() else v.clone()
