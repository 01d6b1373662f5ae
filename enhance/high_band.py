"""Keeping the band above 8 kHz of inputs recorded at more than 16 kHz.

The model runs at 16 kHz, so of a 44.1 or 48 kHz recording it sees, and returns, only the band below 8 kHz;
upsampled as it is, the output would sound muffled (no sibilance, no air). This module adds the rest back,
gated by what the model did at the top of its band:

    x (input rate) --soxr--> x16 --model--> y16 --soxr--> up(y16)
    high band   h = x - up(x16)            (exactly what the resampling removed: up(x16) + h = x)
    gain        g = sqrt(E_y / E_x)        per 4-ms block: energies of y16 and x16 in 6-8 kHz, smoothed, <= 1
    output        up(y16) + g * h

So a block where the model removed noise near 8 kHz has its high band attenuated by as much, and one where it
kept speech keeps its high band. With an untouched y16 (g = 1) the output is the input, sample for sample.

Everything is causal and kept in :class:`HighBandState`, so the file path (blocks of any size), the raw PCM pipe,
the server's WebSocket stream and the whole-array path give the same samples; the gate holds back no output (its
gains are known for every 4-ms block of each 16-ms hop the engine emits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import soxr

from enhance.audio_io import MODEL_RATE


@dataclass(frozen=True)
class HighBandConfig:
    band_hz: float = 6000.0  # the model's band whose gain carries over: band_hz ... 8 kHz
    block: int = 64  # samples at 16 kHz per gain (4 ms)
    smoothing_ms: float = 4.0  # time constant of the energy averages
    taps: int = 33  # the 16 kHz high-pass FIR that isolates the band (odd)

    def __post_init__(self) -> None:
        if not 0 < self.band_hz < MODEL_RATE / 2:
            raise ValueError(f"band_hz must be between 0 and {MODEL_RATE // 2} Hz, not {self.band_hz}")
        if self.block < 1 or not self.smoothing_ms > 0:
            raise ValueError("block must be >= 1 and smoothing_ms > 0")
        if self.taps < 3 or self.taps % 2 == 0:  # an even count is no longer a symmetric high-pass
            raise ValueError(f"taps must be odd and >= 3, not {self.taps}")


def highpass_fir(cfg: HighBandConfig) -> np.ndarray:
    """A windowed-sinc high-pass at ``band_hz`` for 16 kHz signals (float64, ``cfg.taps`` taps)."""
    n = np.arange(cfg.taps) - (cfg.taps - 1) / 2
    cut = cfg.band_hz / MODEL_RATE  # cycles per sample
    low = 2 * cut * np.sinc(2 * cut * n) * np.blackman(cfg.taps)
    low /= low.sum()
    high = -low
    high[(cfg.taps - 1) // 2] += 1.0
    return high


@dataclass
class GainState:
    """The gain tracker's state for ``channels`` channels (float64). The averages and the last gain are None
    until the first block (which starts the averages at its own energies)."""

    x_tail: np.ndarray  # [C, taps - 1] last samples of x16 and y16 (the FIR's memory)
    y_tail: np.ndarray
    x_pending: np.ndarray  # [C, < block] band samples of the block not yet complete
    y_pending: np.ndarray
    x_energy: np.ndarray | None = None  # [C] smoothed band energies
    y_energy: np.ndarray | None = None
    last_gain: np.ndarray | None = None  # [C] the previous block's gain (each block ramps from it)


class GainTracker:
    """Per-sample gains at 16 kHz from the noisy (x16) and enhanced (y16) signals, in blocks of ``cfg.block``:
    ``push`` returns gains for the complete blocks; ``finish`` for the rest."""

    def __init__(self, channels: int, cfg: HighBandConfig | None = None) -> None:
        self.cfg = cfg or HighBandConfig()
        self.fir = highpass_fir(self.cfg)
        self.alpha = math.exp(-self.cfg.block / (MODEL_RATE * self.cfg.smoothing_ms / 1000.0))
        tail, empty = np.zeros((channels, self.cfg.taps - 1)), np.zeros((channels, 0))
        self.state = GainState(x_tail=tail, y_tail=tail, x_pending=empty, y_pending=empty)

    def push(self, x16: np.ndarray, y16: np.ndarray) -> np.ndarray:
        """Take the next samples of both ([C, n], the same n); the gains of every block now complete."""
        if x16.shape != y16.shape:
            raise ValueError(f"noisy and enhanced blocks differ in shape: {x16.shape} vs {y16.shape}")
        s = self.state
        xb, s.x_tail = self._band(x16, s.x_tail)
        yb, s.y_tail = self._band(y16, s.y_tail)
        s.x_pending = np.concatenate([s.x_pending, xb], axis=1)
        s.y_pending = np.concatenate([s.y_pending, yb], axis=1)
        whole = s.x_pending.shape[1] // self.cfg.block * self.cfg.block
        gains = self._gains(s.x_pending[:, :whole], s.y_pending[:, :whole])
        s.x_pending, s.y_pending = s.x_pending[:, whole:], s.y_pending[:, whole:]
        return gains

    def finish(self) -> np.ndarray:
        """The gains of the last, incomplete block (possibly none)."""
        s = self.state
        gains = self._gains(s.x_pending, s.y_pending)
        s.x_pending, s.y_pending = s.x_pending[:, :0], s.y_pending[:, :0]
        return gains

    def _band(self, sig: np.ndarray, tail: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``sig`` through the high-pass FIR, continuing from ``tail``; and the next call's tail."""
        full = np.concatenate([tail, np.asarray(sig, np.float64)], axis=1)
        if sig.shape[1] == 0:  # np.convolve's "valid" would return 2 samples, not none
            return np.zeros((sig.shape[0], 0)), tail
        band = np.stack([np.convolve(row, self.fir, mode="valid") for row in full])
        return band, full[:, full.shape[1] - (self.cfg.taps - 1) :]

    def _gains(self, xb: np.ndarray, yb: np.ndarray) -> np.ndarray:
        """Per-sample gains of whole blocks (or of one last, shorter block), vectorised over the blocks."""
        s, n = self.state, xb.shape[1]
        if n == 0:
            return xb.copy()
        block = min(self.cfg.block, n)
        blocks = n // block
        ex = np.mean(xb.reshape(xb.shape[0], blocks, block) ** 2, axis=2)  # [C, blocks]
        ey = np.mean(yb.reshape(yb.shape[0], blocks, block) ** 2, axis=2)
        # the first block starts the averages at its own energies
        ex_s = self._smooth(ex, ex[:, 0] if s.x_energy is None else s.x_energy)
        ey_s = self._smooth(ey, ey[:, 0] if s.y_energy is None else s.y_energy)
        s.x_energy, s.y_energy = ex_s[:, -1], ey_s[:, -1]
        tiny = 1e-10  # -100 dBFS: below it there is nothing to gate (the high band is as quiet)
        gain = np.minimum(1.0, np.sqrt((ey_s + tiny) / (ex_s + tiny)))  # [C, blocks]
        first = gain[:, :1] if s.last_gain is None else s.last_gain[:, None]
        prev = np.concatenate([first, gain[:, :-1]], axis=1)
        s.last_gain = gain[:, -1]
        ramp = np.arange(1, block + 1) / block  # each block ramps from the previous block's gain to its own
        out = prev[:, :, None] + (gain - prev)[:, :, None] * ramp
        return out.reshape(xb.shape[0], n)

    def _smooth(self, e: np.ndarray, start: np.ndarray) -> np.ndarray:
        """The one-pole average a * S[k-1] + (1 - a) * e[k] over the blocks of ``e`` [C, m], from S[-1] =
        ``start``; in closed form over segments short enough that a**-(length - 1) stays below e**600 (64 blocks
        with the defaults: e**63)."""
        a, out, prev = self.alpha, np.empty_like(e), start
        length = int(max(1, min(64, 600 // max(-math.log(a), 1e-300)))) if a > 0 else 1
        for i in range(0, e.shape[1], length):
            seg = e[:, i : i + length]
            k = np.arange(seg.shape[1])
            acc = np.cumsum(seg * a ** (-k), axis=1)
            out[:, i : i + length] = a ** (k + 1) * prev[:, None] + (1 - a) * a**k * acc
            prev = out[:, i + seg.shape[1] - 1]
        return out


@dataclass
class HighBandState:
    """What :class:`HighBand` holds between blocks: its resampler of x16 and FIFOs of the signals it pairs (all
    [n, C] pieces, each FIFO's first sample aligned with the same input sample)."""

    up_x: soxr.ResampleStream
    gains: np.ndarray  # [C, n] 16 kHz gains from gain_start on
    x: list[np.ndarray] = field(default_factory=list)  # the input, at its rate
    up_x16: list[np.ndarray] = field(default_factory=list)  # up(x16)
    y: list[np.ndarray] = field(default_factory=list)  # up(y16), not yet out
    x16: list[np.ndarray] = field(default_factory=list)  # x16 not yet paired with y16
    gain_start: int = 0
    emitted: int = 0  # input-rate samples out so far


class HighBand:
    """Adds the gated high band to the upsampled output of a stream (see the module's docstring).

    ``add_input(x, x16)`` takes each input block ([n, C] at ``rate``) and what the down-resampler made of it, as
    they are read (``last`` with the resampler's final output). ``output(y, y16)`` takes each upsampled output
    block and the 16 kHz block it came from (aligned with the input from sample 0) and returns the output samples
    that are complete (their gain and high band known); with ``last``, all the rest."""

    def __init__(
        self, rate: int, channels: int, cfg: HighBandConfig | None = None, quality: str = "HQ"
    ) -> None:
        """``quality``: soxr's, as the stream's own resamplers (the high band is what they remove)."""
        if rate <= MODEL_RATE:
            raise ValueError(f"there is no band above 8 kHz at {rate} Hz")
        self.rate, self.channels = rate, channels
        self.tracker = GainTracker(channels, cfg)
        up_x = soxr.ResampleStream(MODEL_RATE, rate, channels, dtype="float32", quality=quality)
        self.state = HighBandState(up_x, np.ones((channels, 0)))

    def add_input(self, x: np.ndarray, x16: np.ndarray, last: bool = False) -> None:
        s = self.state
        x16 = np.ascontiguousarray(x16, np.float32)
        s.x.append(np.asarray(x, np.float32))
        s.up_x16.append(s.up_x.resample_chunk(x16, last=last))
        s.x16.append(x16)

    def output(self, y: np.ndarray, y16: np.ndarray, last: bool = False) -> np.ndarray:
        s = self.state
        s.y.append(np.asarray(y, np.float32))
        x16 = self._take(s.x16, y16.shape[1])
        if x16.shape[0] != y16.shape[1]:
            raise ValueError("more enhanced than noisy samples at 16 kHz")
        parts = [s.gains, self.tracker.push(x16.T.astype(np.float64), np.asarray(y16, np.float64))]
        if last:
            parts.append(self.tracker.finish())
        gains = np.concatenate(parts, axis=1)
        n = min(_rows(s.y), _rows(s.up_x16), _rows(s.x))
        if not last:  # input-rate samples whose gain (at 16 kHz index floor(i * 16000 / rate)) is known
            known = s.gain_start + gains.shape[1]
            n = min(n, -(-known * self.rate // MODEL_RATE) - s.emitted)
        y_out, up_x16, x = (self._take(f, n) for f in (s.y, s.up_x16, s.x))
        if n and gains.shape[1]:
            idx = (np.arange(s.emitted, s.emitted + n) * MODEL_RATE) // self.rate - s.gain_start
            g = gains[:, np.minimum(idx, gains.shape[1] - 1)].T.astype(np.float32)
        else:
            g = np.ones_like(y_out)
        s.emitted += n
        drop = min(gains.shape[1], max(0, (s.emitted * MODEL_RATE) // self.rate - s.gain_start))
        s.gains, s.gain_start = gains[:, drop:], s.gain_start + drop
        return y_out + g * (x - up_x16)

    def _take(self, fifo: list[np.ndarray], n: int) -> np.ndarray:
        """The first ``n`` rows of the pieces in ``fifo`` (taken out of it)."""
        joined = np.concatenate(fifo, axis=0) if fifo else np.zeros((0, self.channels), np.float32)
        fifo[:] = [joined[n:]] if len(joined) > n else []
        return joined[:n]


def _rows(fifo: list[np.ndarray]) -> int:
    return sum(len(p) for p in fifo)


def high_band_output(
    x: np.ndarray,
    x16: np.ndarray,
    y: np.ndarray,
    y16: np.ndarray,
    rate: int,
    cfg: HighBandConfig | None = None,
) -> np.ndarray:
    """The whole-array form: ``x`` [C, n] at ``rate``, its ``x16`` and enhanced ``y16`` [C, m] at 16 kHz, and
    ``y`` = up(y16) [C, n]; returns ``y`` with the gated high band (the samples :class:`HighBand` gives fed in
    blocks, to resampler rounding)."""
    hb = HighBand(rate, x.shape[0], cfg)
    pieces, step = [], 10 * MODEL_RATE  # 10 s at a time: the gate's own buffers stay bounded
    for i in range(0, max(1, y16.shape[1]), step):
        last = i + step >= y16.shape[1]
        j0, j1 = (round(k * rate / MODEL_RATE) for k in (i, i + step))
        hb.add_input(x.T[j0 : None if last else j1], x16.T[i : i + step], last=last)
        pieces.append(hb.output(y.T[j0 : None if last else j1], y16[:, i : i + step], last=last))
    out = np.concatenate(pieces).T
    if out.shape[1] < x.shape[1]:  # the resampler's rounding: the last few samples without their high band
        out = np.concatenate([out, y[:, out.shape[1] :]], axis=1)
    return out[:, : x.shape[1]]
