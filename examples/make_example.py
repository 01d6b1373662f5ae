"""Make the example clip shipped with tim-enhance (``examples/noisy.wav`` and ``examples/clean.wav``).

Speech is synthesised with espeak-ng (Debian package ``espeak-ng``), noise is generated here: pink noise with a
slow level drift, mains hum with harmonics and a few knocks, mixed at 5 dB SNR. Nothing is taken from any corpus.
Run: ``python examples/make_example.py`` (needs espeak-ng on PATH; the committed files were made this way).
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

TEXT = (
    "Speech enhancement removes the noise around a voice. "
    "This example was made by the project, with a synthetic voice and generated noise."
)
RATE = 16000
SNR_DB = 5.0
HERE = Path(__file__).resolve().parent


def synthesise(text: str) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(out), text], check=True)
        wav, rate = sf.read(out, dtype="float32")
    return np.asarray(soxr.resample(wav, rate, RATE), dtype=np.float32)


def noise(n: int, rng: np.random.Generator) -> np.ndarray:
    white = rng.standard_normal(n)
    spectrum = np.fft.rfft(white)
    spectrum /= np.sqrt(np.maximum(np.arange(len(spectrum)), 1.0))  # 1/f power: pink
    pink = np.fft.irfft(spectrum, n)
    t = np.arange(n) / RATE
    pink *= 1.0 + 0.5 * np.sin(2 * np.pi * 0.3 * t)  # slow level drift
    hum = sum(np.sin(2 * np.pi * 50 * k * t) / k for k in (1, 2, 3, 5))
    knocks = np.zeros(n)
    for at in rng.uniform(0.5, n / RATE - 0.5, size=4):
        i = int(at * RATE)
        length = int(0.08 * RATE)
        knocks[i : i + length] += (
            rng.standard_normal(length) * np.exp(-np.arange(length) / (0.015 * RATE)) * 8
        )
    mix = pink / pink.std() + 0.3 * hum + knocks
    return mix.astype(np.float32)


def main() -> None:
    rng = np.random.default_rng(20261122)
    clean = synthesise(TEXT)
    clean = np.concatenate([np.zeros(RATE // 2, np.float32), clean, np.zeros(RATE // 2, np.float32)])
    clean *= 0.1 / np.sqrt(np.mean(clean**2))  # -20 dBFS RMS
    n = noise(len(clean), rng)
    n *= np.sqrt(np.mean(clean**2) / (np.mean(n**2) * 10 ** (SNR_DB / 10)))
    noisy = clean + n
    peak = np.abs(noisy).max()
    if peak > 0.95:
        clean, noisy = clean * 0.95 / peak, noisy * 0.95 / peak
    sf.write(HERE / "clean.wav", clean, RATE, subtype="PCM_16")
    sf.write(HERE / "noisy.wav", noisy, RATE, subtype="PCM_16")
    print(f"wrote {HERE / 'noisy.wav'} ({len(noisy) / RATE:.2f} s, {SNR_DB} dB SNR)")


if __name__ == "__main__":
    main()
