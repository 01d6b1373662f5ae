"""Real-time raw PCM pipes: interleaved PCM on one stream in, enhanced PCM out as soon as it is final.

    arecord -f S16_LE -r 16000 -c 1 -t raw | enhance-cli --stream - -o - | aplay -f S16_LE -r 16000 -c 1 -t raw

The output is the enhanced signal sample for sample, aligned with the input (nothing is prepended): each output
sample is written at most ``StreamingEnhancer.latency_ms`` (48 ms) after its input sample arrived, plus the
resampler's delay when ``rate`` is not 16 kHz. The delay is not compensated in the stream itself (it cannot be, in
real time); in file mode (``enhance-cli --stream in.wav -o out.wav``) the output file is aligned with the input.
Above 16 kHz the band above 8 kHz is kept, gated by the model (:mod:`enhance.high_band`; ``high_band=False``:
left out), without adding delay.
"""

from __future__ import annotations

from typing import Any, BinaryIO

import numpy as np

from enhance.audio_io import (
    MAX_FLOAT_SAMPLE,
    AudioError,
    encoded_kind,
    mpeg_stream,
    sample_value_error,
)
from enhance.pcm import decode_pcm, encode_pcm, frame_bytes
from enhance.rate_stream import RateStream
from enhance.streaming import StreamingEnhancer
from models.enhancer import Enhancer


def stream_pcm(
    model: Enhancer,
    fin: BinaryIO,
    fout: BinaryIO,
    *,
    rate: int,
    channels: int,
    pcm: str = "s16le",
    block: int = 256,
    backend: Any = None,
    high_band: bool = True,
    low_latency: bool = False,
) -> tuple[int, list[str]]:
    """Enhance raw interleaved PCM from ``fin`` to ``fout`` until end of input; returns the samples written (per
    channel) and the warnings (input that ended inside a sample frame), for the caller to report.
    ``low_latency``: at rates other than 16 kHz, soxr's LQ resamplers, which hold back less audio than its HQ
    ones (the offline path's), as the WebSocket stream's ``"resampling": "low_latency"``."""
    width = frame_bytes(channels, pcm)
    engine = StreamingEnhancer(model, channels, backend=backend)
    stream = RateStream(engine, rate, high_band=high_band, quality="LQ" if low_latency else "HQ")
    pending = b""

    def write(y: np.ndarray) -> None:
        fout.write(encode_pcm(y, pcm))
        fout.flush()

    read = getattr(fin, "read1", fin.read)
    head = b""
    while len(head) < 4:  # enough to recognise an encoded file sent by mistake
        more = read(4 - len(head))
        if not more:
            break
        head += more
    # WAV, FLAC, Ogg, AIFF, CAF, AU, W64, an MP3 with an ID3 tag, and an untagged MP3: its first frame header
    # alone is also a plausible pair of PCM samples, so a valid one waits for the next frame's (it was enhanced as
    # PCM: noise out, exit 0)
    while mpeg_stream(head) is None:
        more = read(4096)
        if not more:
            break
        head += more
    # named: its first bytes, shown as text, were mojibake for an MP3 ("\ufffd\ufffd\ufffdd")
    kind = encoded_kind(head)
    if kind is not None:
        raise AudioError(
            f"<stdin>: starts like an encoded audio file ({kind}), but --stream - -o - reads raw PCM: "
            "leave out --stream to enhance an encoded file from stdin"
        )
    pending = head
    while True:
        data = read(block * width)
        if not data and len(pending) < width:
            break
        data = pending + data
        n = len(data) // width
        pending = data[n * width :]
        if n == 0:
            continue
        x = decode_pcm(data[: n * width], channels, pcm)  # [channels, n]
        problem = sample_value_error(x)
        if problem:  # the stream ends at the bad sample: the good ones before it still come out, in full
            good = x[:, : int(np.argmax(~(np.abs(x) <= MAX_FLOAT_SAMPLE).all(axis=0)))]
            write(stream.process_last(good))
            raise AudioError(
                f"<stdin>: {problem} in the PCM stream (the {stream.received} samples before it were written)"
            )
        write(stream.process(x))
    write(stream.finish())
    warnings = [  # (printed here, it was missing from --json's "warnings")
        f"<stdin> ended inside a sample frame: its last {len(pending)} byte(s) were left out ({width} bytes per "
        f"frame of {channels} {pcm} sample(s))"
    ]
    return stream.sent, warnings if pending else []
