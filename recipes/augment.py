"""Training-data augmentation applied before mixing: random equalisation of the speech and of the noise, and a
second noise file layered over the first.

With 45 minutes of training noise and 1.5 hours of speech (the shared corpus), the default model fits its training
mixtures far better than the dev pairs, whose noise and speakers it has never heard (training loss 0.0055 against
0.0092 on the dev pairs at epoch 58). These widen what a segment can sound like without new recordings.

Every augmentation draws from its own generator (``augment_rng``), separate from the mixing draws, and a
probability of 0 (the default) draws nothing: runs configured before this module existed, or with it off, see
exactly the batches they saw before (tested).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AugmentConfig:
    speech_eq_prob: float = 0.0  # chance of a random EQ on the clean speech (target and mixture alike)
    noise_eq_prob: float = 0.0  # chance of a random EQ on the noise
    eq_db: float = 9.0  # each EQ control point's gain is uniform in [-eq_db, +eq_db] dB
    eq_points: int = 6  # control points, log-spaced from 62.5 Hz to 8 kHz (gain linear in log-frequency)
    noise_mix_prob: float = 0.0  # chance that a second noise file is added to the first
    noise_mix_db: tuple[float, float] = (-10.0, 0.0)  # 2nd noise's power over the first's (dB), uniform

    def __post_init__(self) -> None:
        for name in ("speech_eq_prob", "noise_eq_prob", "noise_mix_prob"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if self.eq_db < 0:
            raise ValueError(f"eq_db must be >= 0, got {self.eq_db}")
        if self.eq_points < 2:
            raise ValueError(f"eq_points must be >= 2, got {self.eq_points}")
        if self.noise_mix_db[0] > self.noise_mix_db[1]:
            raise ValueError(f"noise_mix_db must be (low, high) with low <= high, got {self.noise_mix_db}")

    @property
    def active(self) -> bool:
        return max(self.speech_eq_prob, self.noise_eq_prob, self.noise_mix_prob) > 0


def augment_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of example ``index`` in ``epoch``: its own stream (key 2), apart from the mixing's (key 1)."""
    return np.random.default_rng([seed, epoch, 2, index])


def random_eq(
    x: np.ndarray, rng: np.random.Generator, cfg: AugmentConfig, sample_rate: int = 16000
) -> np.ndarray:
    """``x`` through a random zero-phase equaliser: gains drawn at ``cfg.eq_points`` frequencies log-spaced from
    62.5 Hz to half the sample rate, interpolated linearly in dB over log-frequency (flat below the first point),
    applied to the spectrum of the segment zero-padded to twice its length, so the filter's ringing (tens of ms at
    most) falls into the padding instead of wrapping round from one end of the segment to the other."""
    n = len(x)
    if n == 0:
        return x
    points = np.geomspace(62.5, sample_rate / 2, cfg.eq_points)
    gains_db = rng.uniform(-cfg.eq_db, cfg.eq_db, cfg.eq_points)
    freqs = np.fft.rfftfreq(2 * n, 1.0 / sample_rate)
    curve_db = np.interp(np.log(np.maximum(freqs, points[0])), np.log(points), gains_db)
    spectrum = np.fft.rfft(x.astype(np.float64), 2 * n) * 10.0 ** (curve_db / 20.0)
    return np.fft.irfft(spectrum, 2 * n)[:n].astype(np.float32)


def augment(
    clean: np.ndarray,
    noise: np.ndarray,
    rng: np.random.Generator,
    cfg: AugmentConfig,
    another_noise: Callable[[np.random.Generator], np.ndarray],
    sample_rate: int = 16000,
) -> tuple[np.ndarray, np.ndarray]:
    """(clean, noise) after the augmentations ``cfg`` asks for, before they are mixed. ``another_noise(rng)``
    gives a second noise segment of the same length (the dataset's noise draw). Each step draws from ``rng``
    only when its probability is above 0."""
    if cfg.speech_eq_prob > 0 and rng.random() < cfg.speech_eq_prob:
        clean = random_eq(clean, rng, cfg, sample_rate)
    if cfg.noise_mix_prob > 0 and rng.random() < cfg.noise_mix_prob:
        second = another_noise(rng)
        p1 = float(np.mean(noise.astype(np.float64) ** 2))
        p2 = float(np.mean(second.astype(np.float64) ** 2))
        rel = 10.0 ** (rng.uniform(*cfg.noise_mix_db) / 10.0)
        if p1 <= 1e-10:  # a silent stretch of the first: the second alone (mixing sets the SNR anyway)
            noise = second
        elif p2 > 1e-10:
            noise = (noise + second * np.sqrt(rel * p1 / p2)).astype(np.float32)
    if cfg.noise_eq_prob > 0 and rng.random() < cfg.noise_eq_prob:
        noise = random_eq(noise, rng, cfg, sample_rate)
    return clean, noise
