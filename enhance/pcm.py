"""Raw interleaved PCM, as the CLI's ``--stream - -o -`` pipe and the server's WebSocket stream carry it: the sample
formats both accept and one codec for both, always little-endian whatever the host's byte order."""

from __future__ import annotations

import numpy as np

from enhance.audio_io import pcm_frames

# sample format name -> bytes per sample
PCM_FORMATS = {"s16le": 2, "f32le": 4}


def frame_bytes(channels: int, fmt: str) -> int:
    """Bytes per sample frame (one sample of every channel) of interleaved PCM in ``fmt``."""
    return PCM_FORMATS[fmt] * channels


def decode_pcm(data: bytes, channels: int, fmt: str) -> np.ndarray:
    """Interleaved little-endian PCM -> float32 ``[channels, n]``. Raises ValueError for a bad frame size."""
    width = frame_bytes(channels, fmt)
    if len(data) % width:
        raise ValueError(
            f"frame of {len(data)} bytes is not a whole number of {channels}-channel {fmt} samples "
            f"({width} bytes each)"
        )
    if fmt == "s16le":
        x = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    else:
        x = np.frombuffer(data, dtype="<f4").astype(np.float32)
    return np.ascontiguousarray(x.reshape(-1, channels).T)


def encode_pcm(wav: np.ndarray, fmt: str) -> bytes:
    """float ``[channels, n]`` -> interleaved little-endian PCM (s16le is clipped to its range)."""
    x = np.ascontiguousarray(wav.T)
    if fmt == "s16le":
        # rounded as every integer output is
        return pcm_frames(x, "RAW", "PCM_16").astype("<i2", copy=False).tobytes()
    return x.astype("<f4").tobytes()
