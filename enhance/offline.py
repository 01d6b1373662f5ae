"""Offline enhancement of whole signals at the model rate (16 kHz).

``enhance_waveform`` is the reference path: DC blocker (:mod:`enhance.dc_blocker`) -> STFT -> log1p magnitude ->
model -> rebuild with the noisy phase, at
the input's exact length. Each channel is enhanced independently (channels are a batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from enhance.audio_io import MODEL_RATE, check_audio, fit_length, rate_range_error, resample, whole_rate
from enhance.dc_blocker import remove_dc
from enhance.high_band import high_band_output
from enhance.stft import log_magnitude, rebuild, stft
from models.enhancer import Enhancer, eval_mode, expect_enhancer


@dataclass
class Enhanced:
    wav: np.ndarray  # [channels, samples] float32, same rate and length as the input
    # per TIM layer with competition: [channels, frames, n_s] float32 (None unless asked for)
    competition: list[np.ndarray] | None = None


@torch.inference_mode()
def enhance_waveform(model: Enhancer, wav: np.ndarray, return_competition: bool = False) -> Enhanced:
    """Enhance ``[channels, samples]`` float audio at 16 kHz (a NumPy array, or anything ``np.asarray`` takes);
    returns the same shape."""
    expect_enhancer(model)
    wav = np.asarray(wav)
    check_audio(wav)
    param = next(model.parameters())
    data = remove_dc(wav, model.cfg.stft.hop_length)  # a new array, filtered as the streaming engine does
    x = torch.from_numpy(data).to(device=param.device, dtype=param.dtype)
    spec = stft(x, model.cfg.stft)  # [C, T, F]
    with eval_mode(model):
        out = model(log_magnitude(spec), return_competition=return_competition)
    y = rebuild(out.log_mag, spec, model.cfg.stft, wav.shape[1])
    maps = [c.float().cpu().numpy() for c in out.competition] if out.competition is not None else None
    return Enhanced(y.float().cpu().numpy(), maps)


def enhance_audio(
    model: Enhancer,
    wav: np.ndarray,
    sample_rate: int,
    return_competition: bool = False,
    high_band: bool = True,
) -> Enhanced:
    """Enhance ``[channels, samples]`` float audio at 1-768 kHz: resampled to 16 kHz and back, at the input's
    exact length. ``high_band``: above 16 kHz, keep the input's band above 8 kHz, gated by the model's gain near
    8 kHz (:mod:`enhance.high_band`); False: the output holds the 16 kHz model's band only."""
    wav = np.asarray(wav)
    check_audio(wav)
    sample_rate = whole_rate(sample_rate)
    problem = rate_range_error(sample_rate)  # as the CLI and the server refuse it
    if problem:
        raise ValueError(problem)
    x = resample(wav, sample_rate, MODEL_RATE)
    stand_in = x.shape[1] == 0
    if stand_in:  # fewer input samples than one at 16 kHz: enhance one
        x = np.zeros((x.shape[0], 1), np.float32)
    result = enhance_waveform(model, x, return_competition)
    y = fit_length(resample(result.wav, MODEL_RATE, sample_rate), wav.shape[1])
    if high_band and sample_rate > MODEL_RATE and not stand_in:  # a stand-in's "band" would be the raw input
        y = high_band_output(np.asarray(wav, np.float32), x, y, result.wav, sample_rate)
    result.wav = y
    return result
