"""The way to the model's 16 kHz and back for audio streamed at another rate.

Two soxr streams (none at 16 kHz) and, above 16 kHz, the band above 8 kHz kept and gated on the way back
(:mod:`enhance.high_band`). Every streamed path goes through it: files in blocks (:mod:`enhance.files`), the raw
PCM pipe (:mod:`enhance.pipe`) and the server's WebSocket streams. Arrays are ``[channels, samples]`` float32, the
streaming engine's layout.
"""

from __future__ import annotations

import numpy as np
import soxr

from enhance.audio_io import MODEL_RATE
from enhance.high_band import HighBand


class RateBridge:
    """``to_model`` each input block, run the model on what it returns, ``from_model`` each enhanced block: the
    output is aligned with the input from sample 0 (soxr's streams hold samples back rather than delay them).
    ``last=True`` on the final call of each side flushes its resampler. ``quality``: soxr's (``HQ``, ``LQ``)."""

    def __init__(self, rate: int, channels: int, *, high_band: bool = True, quality: str = "HQ") -> None:
        self.channels = channels
        same = rate == MODEL_RATE
        self.down = (
            None
            if same
            else soxr.ResampleStream(rate, MODEL_RATE, channels, dtype="float32", quality=quality)
        )
        self.up = (
            None
            if same
            else soxr.ResampleStream(MODEL_RATE, rate, channels, dtype="float32", quality=quality)
        )
        self.band = HighBand(rate, channels, quality=quality) if high_band and rate > MODEL_RATE else None

    def to_model(self, x: np.ndarray, last: bool = False) -> np.ndarray:
        """``[C, n]`` at the stream's rate -> ``[C, m]`` at 16 kHz."""
        if self.down is None:
            return x
        x16 = self._through(self.down, x, last)
        if self.band is not None:
            self.band.add_input(x.T, x16, last)
        return np.ascontiguousarray(x16.T)

    def from_model(self, y16: np.ndarray, last: bool = False) -> np.ndarray:
        """``[C, m]`` enhanced at 16 kHz -> ``[C, n]`` at the stream's rate (with the gated high band)."""
        if self.up is None:
            return y16
        y = self._through(self.up, y16, last)
        if self.band is not None:
            y = self.band.output(y, y16, last)
        return np.ascontiguousarray(y.T)

    def _through(self, stream: soxr.ResampleStream, x: np.ndarray, last: bool) -> np.ndarray:
        """``[C, n]`` through a resampler, as ``[n', C]`` (soxr's layout)."""
        y = stream.resample_chunk(np.ascontiguousarray(x.T, dtype=np.float32), last=last)
        return np.asarray(y, np.float32).reshape(-1, self.channels)
