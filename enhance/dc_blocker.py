"""The DC blocker in front of the model: a first-order high-pass at :data:`CUTOFF_HZ` (5 Hz).

A DC offset (a cheap sound card, a noise recording with one) leaks through the sqrt-Hann analysis window into the
lowest dozen bins, and the network, which never saw one in training, then did worse everywhere: 0.1 of offset
took the bundled model's output on ``examples/noisy.wav`` from 8.2 dB to 4.9 dB SNR (the input's own: 5.1), and
the output kept the offset. RNNoise and WebRTC's audio processing put a high-pass in front of their suppressors
for the same reason; this one is as low as a DC blocker can be while still settling within about 30 ms
(time constant ``1 / (2 pi 5 Hz)``), so that speech (from about 60 Hz) is untouched.

    y[n] = g (x[n] - x[n-1]) + R y[n-1],    R = exp(-2 pi CUTOFF_HZ / rate),    g = (1 + R) / 2

(``g``: unity gain at the Nyquist frequency, 0 at DC). It is causal and adds no delay. To give the offline and the
streaming engines the same samples bit for bit, whatever the chunking, the signal is filtered in blocks of one
hop (``block`` samples) aligned to its first sample, each one with the same float64 operations: its response
from rest as a scaled cumulative sum (``y[i] = R**i * sum_{j<=i} d[j] / R**j``; ``R**-block`` stays below 2, so
nothing is lost), then the state carried in from the block before; only the last block of a signal may be
shorter. All of a signal's blocks are computed at once (O(n), about 0.4 ms for 4 s), the carried state alone
block by block. The streaming engine holds back the incomplete block, which costs no delay: a frame needs whole
hops of input anyway.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

CUTOFF_HZ = 5.0
RATE = 16000  # the model's rate: the blocker runs on the 16 kHz signal the model sees
POLE = math.exp(-2.0 * math.pi * CUTOFF_HZ / RATE)  # R
GAIN = (1.0 + POLE) / 2.0  # g: unity gain at the Nyquist frequency


@functools.lru_cache(maxsize=4)
def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """For a block of ``n`` samples: ``R**i`` and ``R**(i + 1)``, i = 0 ... n - 1 (read-only)."""
    powers = POLE ** np.arange(n + 1, dtype=np.float64)
    rise, carry = powers[:-1].copy(), powers[1:].copy()
    rise.setflags(write=False)
    carry.setflags(write=False)
    return rise, carry


@dataclass
class DCState:
    """The filter's memory per channel: the last input and output sample (float64)."""

    last_in: np.ndarray  # [C]
    last_out: np.ndarray  # [C]

    @classmethod
    def zeros(cls, channels: int) -> DCState:
        return cls(np.zeros(channels), np.zeros(channels))


def block_dc(x: np.ndarray, state: DCState, block_size: int) -> np.ndarray:
    """Filter ``x`` [C, n] (float64), ``block_size`` samples at a time from its first sample (the last block may
    be shorter: give a stream's partial block only at its end); updates ``state``. Returns [C, n] float64."""
    c, n = x.shape
    if n == 0:
        return np.zeros((c, 0))
    blocks = -(-n // block_size)
    padded = np.zeros((c, blocks * block_size))  # a short last block: zeros after it change nothing before
    padded[:, :n] = x
    d = (np.diff(padded, axis=1, prepend=state.last_in[:, None]) * GAIN).reshape(c, blocks, block_size)
    rise, carry = _powers(block_size)
    y = np.cumsum(d / rise, axis=2) * rise  # each block's response from rest
    # each block's carried state, the output just before it: block k - 1's last output as computed below (the
    # same two float64 roundings), in Python floats, which beat numpy's per-call cost over hundreds of blocks
    decay, ends = float(carry[-1]), y[:, :, -1].tolist()
    start = np.empty((c, blocks))
    for ch in range(c):
        carried = [float(state.last_out[ch])]
        for k in range(1, blocks):
            carried.append(ends[ch][k - 1] + carried[-1] * decay)
        start[ch] = carried
    out = (y + start[:, :, None] * carry).reshape(c, -1)[:, :n]
    state.last_in, state.last_out = x[:, -1].copy(), out[:, -1].copy()
    return out


def remove_dc(wav: np.ndarray, block_size: int) -> np.ndarray:
    """The whole signal ``wav`` [C, n] through the blocker from silence, in ``wav``'s float dtype, filtered as
    the streaming engine filters it (``block_size``: the model's hop)."""
    filtered = block_dc(np.asarray(wav, np.float64), DCState.zeros(wav.shape[0]), block_size)
    return filtered.astype(wav.dtype, copy=False)
