"""The way to the model's 16 kHz and back for audio streamed at another rate.

Two soxr streams (none at 16 kHz) and, above 16 kHz, the band above 8 kHz kept and gated on the way back
(:mod:`enhance.high_band`). Every streamed path goes through it: files in blocks (:mod:`enhance.files`), the raw
PCM pipe and the server's WebSocket streams (both through :class:`enhance.rate_stream.RateStream`). Arrays are
``[channels, samples]`` float32, the streaming engine's layout.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import soxr

from enhance.audio_io import MODEL_RATE, check_chunk
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
        """``[C, n]`` float samples at the stream's rate -> ``[C, m]`` at 16 kHz. A chunk the engine would refuse
        raises its ValueError here, before the resampler takes any of it in (at 16 kHz the engine checks)."""
        if self.down is None:
            return x
        x = np.asarray(x)
        check_chunk(x, self.channels)
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


STEADY_FRAMES = 30_000  # 10-ms frames of the dry run after output begins: 5 minutes


@functools.lru_cache(maxsize=64)
def resampling_ms(rate: int, quality: str = "HQ", engine_latency: int = 768, hop: int = 256) -> float:
    """How much a :class:`RateBridge` of ``quality`` adds to the streaming engine's delay (ms; 0 at the engine's rate;
    ``engine_latency`` and ``hop`` in samples at 16 kHz, the default model's), at most, in steady state, fed 10 ms
    frames (the WebSocket stream's ``ready.resampling_ms``): soxr's streams compensate their filters' delay by holding samples back. A dry run of the
    resamplers with the engine's hold between them (the engine emits whole hops, ``engine_latency - hop``
    samples behind its input; no model runs): their holds do not simply add, as the engine takes whatever the
    first resampler gives in bursts of whole hops (at 1.5 kHz the two alone said 889 ms and held 1085 with it).
    The most held over 5 minutes of steady state: soxr's bursts beat with the hops over long periods (a 5-s run
    said 97 ms at 12 kHz, where a stream held 151 after 11 s; 5 minutes give 153, and 10 more minutes add at
    most a few ms at the rates tried). About 0.3 s of work, once per rate and quality (cached)."""
    if rate == MODEL_RATE:
        return 0.0
    bridge = RateBridge(rate, 1, high_band=False, quality=quality)  # the band holds nothing
    step, fed, out, held = max(1, rate // 100), 0, 0, []
    frame = np.zeros((1, step), np.float32)
    into_engine = out_of_engine = 0
    started = None  # the frame at which output began: below about 2 kHz, more than 1 s is held back
    for i in range(STEADY_FRAMES + 3000):  # (output starts within 30 s)
        into_engine += bridge.to_model(frame).shape[1]
        final = max(0, (into_engine - (engine_latency - hop)) // hop * hop)
        y = np.zeros((1, final - out_of_engine), np.float32)
        out_of_engine = final
        out += bridge.from_model(y).shape[1]
        fed += step
        held.append(fed - out)
        if started is None and out > 0:
            started = i
        if started is not None and i >= started + STEADY_FRAMES:
            break
    ms = 1000.0 * max(held[10:]) / rate - 1000.0 * engine_latency / MODEL_RATE
    return math.ceil(round(10.0 * ms, 6)) / 10.0  # rounded up: announced, it is a bound
