"""Session 30 sketch behind "The signal path in NumPy" (bench/README.md): one 16-ms hop's signal path around the
step written in NumPy, timed alone (µs per hop, fastest of 5 batches of 3,000): the DC blocker on one hop,
framing, window, rfft, magnitude, log1p, then (the step's output taken to be its input) expm1, the noisy phase,
irfft, window and overlap-add. A sketch for its cost only: FixedStepper.run_frames is the real path.

    python bench/results/numpy-signal-path/numpy_hop.py    # output: numpy_hop.txt
"""

import math
import time

import numpy as np

hop, win = 256, 512
window = np.sqrt(0.5 - 0.5 * np.cos(2 * np.pi * np.arange(win) / win)).astype(np.float32)
pole = math.exp(-2 * math.pi * 5 / 16000)
gain = (1 + pole) / 2
powers = pole ** np.arange(hop + 1)
rise, carry = powers[:-1], powers[1:]
buffer = np.zeros(win, np.float32)
tail = np.zeros(hop, np.float32)
pending = np.zeros(hop + 1, np.complex64)
chunk = np.random.default_rng(0).standard_normal(hop).astype(np.float32) * 0.1
dc = [0.0, 0.0]  # the blocker's last input and output


def one_hop() -> np.ndarray:
    x = chunk.astype(np.float64)
    d = np.diff(x, prepend=dc[0]) * gain
    y = np.cumsum(d / rise) * rise + dc[1] * carry
    dc[0], dc[1] = x[-1], y[-1]
    buffer[:hop] = buffer[hop:]
    buffer[hop:] = y
    spec = np.fft.rfft(buffer * window)
    mag = np.abs(spec)
    out = np.log1p(mag)  # the step's output, taken to be its input
    phase = np.divide(pending, np.abs(pending), out=np.ones_like(pending), where=np.abs(pending) > 0)
    frame = np.fft.irfft(np.expm1(np.maximum(out, 0)) * phase, win).astype(np.float32) * window
    result = frame[:hop] + tail
    tail[:] = frame[hop:]
    pending[:] = spec
    return result


for _ in range(300):
    one_hop()
best = float("inf")
for _ in range(5):
    start = time.perf_counter()
    for _ in range(3000):
        one_hop()
    best = min(best, (time.perf_counter() - start) / 3000)
print(f"numpy {np.__version__}: {best * 1e6:.1f} us per hop")
