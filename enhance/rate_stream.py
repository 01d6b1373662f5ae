"""A stream at any rate through the streaming engine: :class:`RateStream`, what the raw PCM pipe
(:mod:`enhance.pipe`) and the server's WebSocket streams run (they had a copy each of this loop)."""

from __future__ import annotations

import numpy as np

from enhance.rate_bridge import RateBridge
from enhance.streaming import StreamingEnhancer


class RateStream:
    """The engine between the two soxr streams of a :class:`RateBridge`, with the counts that keep the output
    exactly as long as the input: output sample i is input sample i enhanced (no padding: it only lags), and
    :meth:`finish` gives back all that is held, padded with zeros where the resamplers' rounding left it short.
    Arrays are ``[channels, samples]`` float32 at ``rate``."""

    def __init__(
        self, engine: StreamingEnhancer, rate: int, *, high_band: bool = True, quality: str = "HQ"
    ) -> None:
        self.engine, self.rate = engine, rate
        self.high_band, self.quality = high_band, quality
        self.bridge = self._bridge()
        self.received = 0  # samples per channel in
        self.sent = 0  # samples per channel out

    @property
    def channels(self) -> int:
        return self.engine.channels

    def _bridge(self) -> RateBridge:
        return RateBridge(self.rate, self.channels, high_band=self.high_band, quality=self.quality)

    def restart(self) -> None:
        """After :meth:`finish` (a ``flush``): the next audio starts a new segment, enhanced as a new stream
        would enhance it (the model's context and the resamplers start again); the counters go on."""
        self.engine.reset()
        self.bridge = self._bridge()

    def _take(self, y: np.ndarray) -> np.ndarray:
        y = y[:, : max(0, self.received - self.sent)]
        self.sent += y.shape[1]
        return y

    def process(self, x: np.ndarray) -> np.ndarray:
        """Enhanced samples that became final with ``x`` (a chunk the engine refuses raises its ValueError and
        changes nothing)."""
        y16 = self.engine.process(self.bridge.to_model(x))
        self.received += x.shape[1]
        return self._take(self.bridge.from_model(y16))

    def process_last(self, x: np.ndarray) -> np.ndarray:
        """``x`` is the stream's last audio: enhance it and flush, as :meth:`process` then :meth:`finish`."""
        return np.concatenate([self.process(x), self.finish()], axis=1)

    def finish(self) -> np.ndarray:
        """All the rest: what the resamplers and the engine hold, then zeros up to the input's length."""
        tail = self.bridge.to_model(np.zeros((self.channels, 0), np.float32), last=True)
        y16 = np.concatenate([self.engine.process(tail), self.engine.flush()], axis=1)
        y = self._take(self.bridge.from_model(y16, last=True))
        short = self.received - self.sent
        if short > 0:  # resampler rounding: the last few samples
            y = np.concatenate([y, np.zeros((self.channels, short), np.float32)], axis=1)
            self.sent += short
        return y
