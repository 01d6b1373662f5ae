"""The training objective: MSE on log1p magnitudes (the paper's), its asymmetric form, and the optional low-level
and PMSQE terms (:class:`recipes.trainer.TrainConfig`)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from enhance.stft import linear_magnitude, log_magnitude, stft
from models.enhancer import Enhancer
from recipes.pmsqe import PMSQE


def loss_fn(
    model: torch.nn.Module,
    noisy: torch.Tensor,
    clean: torch.Tensor,
    amp: bool,
    low_level_weight: float = 0.0,
    low_level_floor: float = 0.01,
    over_weight: float = 0.0,
    pmsqe_weight: float = 0.0,
    pmsqe_as_pesq: bool = False,
) -> torch.Tensor:
    """MSE between predicted and clean log1p magnitudes (the paper's objective), asymmetric when ``over_weight``
    is set, plus the optional low-level and PMSQE terms of :class:`TrainConfig` (``low_level_weight``,
    ``pmsqe_weight``)."""
    core = model.module if isinstance(model, DistributedDataParallel) else model
    assert isinstance(core, Enhancer)
    stft_cfg = core.cfg.stft
    x = log_magnitude(stft(noisy, stft_cfg))
    y = log_magnitude(stft(clean, stft_cfg))
    with torch.autocast(device_type=noisy.device.type, dtype=torch.bfloat16, enabled=amp):
        pred = model(x).log_mag.float()
    if over_weight > 0:  # residual noise (prediction above the target) weighs 1 + over_weight
        err = pred - y
        loss = ((1.0 + over_weight * (err > 0).float()) * err**2).mean()
    else:
        loss = F.mse_loss(pred, y)
    if low_level_weight > 0:
        mag, target = linear_magnitude(pred), linear_magnitude(y)
        low = F.mse_loss(torch.log(mag + low_level_floor), torch.log(target + low_level_floor))
        loss = loss + low_level_weight * low
    if pmsqe_weight > 0:
        loss = loss + pmsqe_weight * pmsqe_of(pred, y, pmsqe_as_pesq).mean()
    return loss


def pmsqe_of(pred: torch.Tensor, target: torch.Tensor, as_pesq: bool = False) -> torch.Tensor:
    """[batch] PMSQE of predicted against clean ``log1p`` magnitudes, on the magnitudes the waveform is rebuilt
    from."""
    return _pmsqe(pred.device, as_pesq)(linear_magnitude(pred) ** 2, linear_magnitude(target) ** 2)


@functools.lru_cache(maxsize=4)
def _pmsqe(device: torch.device, as_pesq: bool = False) -> PMSQE:
    """One PMSQE module (its band tables) per device and variant, built on first use."""
    return PMSQE(as_pesq=as_pesq).to(device)
