"""The model's analysis settings (window, hop, rate): part of every model's config, used by the signal path in
:mod:`enhance.stft` (which re-exports it)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class STFTConfig:
    """Analysis settings of the model (GUIDE §1): 16 kHz, 512-point FFT, 32 ms window, 16 ms hop."""

    sample_rate: int = 16000
    n_fft: int = 512
    win_length: int = 512
    hop_length: int = 256

    def __post_init__(self) -> None:
        if self.sample_rate != 16000:  # every path resamples to 16 kHz (audio_io.MODEL_RATE) before the model
            raise ValueError(f"only 16 kHz models are supported, not {self.sample_rate} Hz")
        if self.win_length != self.n_fft or self.hop_length * 2 != self.win_length:
            raise ValueError("only win_length == n_fft == 2 * hop_length is supported (sqrt-Hann OLA)")

    @property
    def n_bins(self) -> int:
        return self.n_fft // 2 + 1

    @property
    def overlap(self) -> int:
        return self.win_length - self.hop_length

    def n_frames(self, n_samples: int) -> int:
        """Number of STFT frames for a signal of ``n_samples`` samples."""
        return math.ceil(n_samples / self.hop_length) + 1
