"""Validation during training: loss, SI-SDR and PMSQE over the validation pairs, once per epoch."""

from __future__ import annotations

import logging
import math

import numpy as np
import torch
import torch.nn.functional as F

from enhance.stft import log_magnitude, rebuild, stft
from models.enhancer import Enhancer
from recipes.datasets import ValPair
from recipes.dc_blocked import dc_blocked
from recipes.losses import pmsqe_of
from recipes.metrics import si_sdr

log = logging.getLogger(__name__)


@torch.no_grad()
def validate(
    model: Enhancer, pairs: list[ValPair], device: torch.device, dc_blocker: bool = False
) -> dict[str, float]:
    """Mean per-file log-magnitude MSE, SI-SDR (dB, enhanced vs clean) and PMSQE (recipes.pmsqe, a PESQ-like
    disturbance: lower is better) over the validation pairs. ``dc_blocker`` (``DataConfig.dc_blocker``): the noisy
    input goes through the product's DC blocker, and the loss and PMSQE compare with the clean file through it too,
    as training does (:mod:`recipes.dc_blocked`); SI-SDR is always against the clean file as it is, as
    ``recipes.evaluate`` measures it."""
    was_training = model.training
    model.eval()
    losses, sdrs, pmsqes = [], [], []
    for p in pairs:
        noisy_in, clean_ref = (dc_blocked(p.noisy), dc_blocked(p.clean)) if dc_blocker else (p.noisy, p.clean)
        noisy = torch.from_numpy(noisy_in).to(device).unsqueeze(0)
        clean = torch.from_numpy(clean_ref).to(device).unsqueeze(0)
        spec = stft(noisy, model.cfg.stft)
        pred = model(log_magnitude(spec)).log_mag
        target = log_magnitude(stft(clean, model.cfg.stft))
        losses.append(F.mse_loss(pred, target).item())
        pmsqes.append(pmsqe_of(pred, target).item())
        est = rebuild(pred, spec, model.cfg.stft, noisy.shape[-1])
        sdrs.append(si_sdr(p.clean, est[0].cpu().numpy()))
    model.train(was_training)
    silent = sum(not math.isfinite(v) for v in sdrs)
    if silent:  # left out of val_si_sdr's mean (undefined there), which would flatter a model that mutes
        log.warning(
            "validation: %d of %d outputs are silent (all zeros): SI-SDR undefined, left out of val_si_sdr",
            silent,
            len(sdrs),
        )
    return {
        "val_loss": float(np.mean(losses)),
        "val_si_sdr": float(np.nanmean(sdrs)) if len(sdrs) > silent else math.nan,
        "val_pmsqe": float(np.mean(pmsqes)) if pmsqes else math.nan,
    }
