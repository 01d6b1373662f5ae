"""Dynamic mixing: clean speech + noise at a random SNR, drawn anew every epoch, deterministic per seed.

Example ``i`` of epoch ``e`` depends only on ``(seed, e, i)`` (its own ``numpy`` generator), so any worker count,
any process rank and a resumed run produce the same batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from enhance.stft import STFTConfig
from recipes.audio_pool import AudioPool
from recipes.augment import AugmentConfig, augment, augment_rng

WINDOW = STFTConfig().win_length  # a training segment holds at least one STFT frame
MODEL_RATE = STFTConfig().sample_rate  # what the model hears; the corpus must be at it


@dataclass(frozen=True)
class MixingConfig:
    segment_seconds: float = 4.0
    snr_db: tuple[float, float] = (0.0, 40.0)  # uniform (the paper's DNS setting)
    level_dbfs: tuple[float, float] = (-35.0, -15.0)  # RMS of the noisy mixture, uniform
    noise_prob: float = 1.0  # probability that an example has noise at all
    # probability that an example gets a speech pause: the clean speech in a random span of pause_seconds is
    # faded out (10-ms ramps) in both the clean target and the mixture, the noise goes on. Read speech has few
    # pauses, so without this the model hardly sees noise alone (0: off, as in runs before it existed)
    pause_prob: float = 0.0
    pause_seconds: tuple[float, float] = (0.3, 1.5)
    sample_rate: int = 16000
    # random EQ of speech and noise, a second noise layered in (recipes.augment; off by default)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    # passes over the speech segments per epoch, each with its own crop, noise and SNR draws: on a fast GPU and a
    # small corpus one pass takes seconds, and per-epoch validation and loader start-up would dominate
    repeats: int = 1

    def __post_init__(self) -> None:
        if self.sample_rate != MODEL_RATE:  # 8 kHz audio was fed to the 16 kHz model as if it were 16 kHz
            raise ValueError(
                f"sample_rate must be the model's {MODEL_RATE} Hz, got {self.sample_rate}: resample the corpus "
                f"to {MODEL_RATE} Hz (files at other rates are skipped with the reason)"
            )
        if self.sample_rate < 1 or not self.segment_seconds * self.sample_rate >= WINDOW:
            raise ValueError(
                f"segment_seconds must hold at least one {WINDOW}-sample STFT window "
                f"({WINDOW / max(self.sample_rate, 1):g} s), got {self.segment_seconds}"
            )
        for name in ("snr_db", "level_dbfs"):
            low, high = getattr(self, name)
            if not low <= high:
                raise ValueError(f"{name} must be [low, high] with low <= high, got {[low, high]}")
        if not 0.0 <= self.noise_prob <= 1.0:
            raise ValueError(f"noise_prob must be in [0, 1], got {self.noise_prob}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if not 0.0 <= self.pause_prob <= 1.0:
            raise ValueError(f"pause_prob must be in [0, 1], got {self.pause_prob}")
        if not 0.0 < self.pause_seconds[0] <= self.pause_seconds[1]:
            raise ValueError(f"pause_seconds must be 0 < low <= high, got {self.pause_seconds}")
        if self.pause_prob > 0 and self.pause_seconds[0] > self.segment_seconds:
            raise ValueError(
                f"pause_seconds {self.pause_seconds} longer than a segment ({self.segment_seconds} s)"
            )

    @property
    def segment_samples(self) -> int:
        return round(self.segment_seconds * self.sample_rate)


def segment_index(speech: AudioPool, segment: int) -> list[tuple[int, int]]:
    """(file, start) of every segment-long window of the speech pool; one epoch visits each once.

    A file shorter than a segment counts once; a longer one once per started segment.
    """
    index: list[tuple[int, int]] = []
    for f, n in enumerate(speech.frames):
        for start in range(0, max(n - segment // 4, 1), segment):
            index.append((f, start))
    return index


def why_none(pool: AudioPool) -> str:
    """The reasons an empty pool's files were skipped, most common first (with an example of each)."""
    if not pool.skipped:
        return " (none found: is it the right folder, with .wav/.flac/... files?)"
    counts: dict[str, list[str]] = {}
    for s in pool.skipped:
        counts.setdefault(s.reason.split(" (")[0].split(",")[0], []).append(s.path)
    parts = [
        f"{len(paths)} x {reason} (e.g. {paths[0]})"
        for reason, paths in sorted(counts.items(), key=lambda kv: -len(kv[1]))[:3]
    ]
    return f": all {len(pool.skipped)} skipped: " + "; ".join(parts)


class MixingDataset(torch.utils.data.Dataset):
    """Noisy/clean segment pairs, ``[segment_samples]`` float32 each, from speech and noise pools."""

    def __init__(self, speech: AudioPool, noise: AudioPool, cfg: MixingConfig, seed: int) -> None:
        for what, pool in (("speech", speech), ("noise", noise)):
            if len(pool) == 0:  # say why: "no usable speech files" alone left a 48 kHz corpus a mystery
                raise ValueError(f"no usable {what} files{why_none(pool)}")
        self.speech, self.noise, self.cfg, self.seed = speech, noise, cfg, seed
        self.index = segment_index(speech, cfg.segment_samples)
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.index) * self.cfg.repeats

    def order(self, epoch: int) -> np.ndarray:
        """The shuffled example order of ``epoch``."""
        return np.random.default_rng([self.seed, epoch, 0]).permutation(len(self))

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, i = key
        rng = np.random.default_rng([self.seed, epoch, 1, i])
        clean, noise = self._speech(i, rng), self._noise(rng)
        if self.cfg.augment.active:  # its own generator: the mixing draws below stay the same
            clean, noise = augment(
                clean,
                noise,
                augment_rng(self.seed, epoch, i),
                self.cfg.augment,
                self._noise,
                self.cfg.sample_rate,
            )
        noisy, clean = mix(clean, noise, rng, self.cfg)
        insert_pause(noisy, clean, rng, self.cfg)  # after mix: runs without pauses draw the same mixes
        return torch.from_numpy(noisy), torch.from_numpy(clean)

    def _speech(self, i: int, rng: np.random.Generator) -> np.ndarray:
        n_seg = self.cfg.segment_samples
        f, start = self.index[i % len(self.index)]
        n = self.speech.frames[f]
        if n <= n_seg:  # short file: the whole file, at a random place in a zero segment
            out = np.zeros(n_seg, np.float32)
            at = int(rng.integers(0, n_seg - n + 1))
            out[at : at + n] = self.speech.read(f)
            return out
        start = min(start + int(rng.integers(0, n_seg // 2)), n - n_seg)  # jitter within the file
        return self.speech.read(f, start, start + n_seg).astype(np.float32)

    def _noise(self, rng: np.random.Generator) -> np.ndarray:
        n_seg = self.cfg.segment_samples
        f = int(rng.integers(0, len(self.noise)))
        n = self.noise.frames[f]
        if n >= n_seg:
            start = int(rng.integers(0, n - n_seg + 1))
            return self.noise.read(f, start, start + n_seg)
        reps = -(-n_seg // n) + 1  # tile short noise from a random phase
        tiled = np.tile(self.noise.read(f), reps)
        start = int(rng.integers(0, n))
        return tiled[start : start + n_seg]


def mix(
    clean: np.ndarray, noise: np.ndarray, rng: np.random.Generator, cfg: MixingConfig
) -> tuple[np.ndarray, np.ndarray]:
    """(noisy, clean) at an SNR and level drawn from ``cfg``; clean and noisy get the same gain."""
    eps = 1e-10
    p_clean = float(np.mean(clean.astype(np.float64) ** 2))
    p_noise = float(np.mean(noise.astype(np.float64) ** 2))
    if rng.random() < cfg.noise_prob and p_noise > eps:
        snr = rng.uniform(*cfg.snr_db)
        noise = noise * np.sqrt(p_clean / (p_noise * 10 ** (snr / 10) + eps))
    else:
        noise = np.zeros_like(noise)
    noisy = clean + noise
    rms = float(np.sqrt(np.mean(noisy.astype(np.float64) ** 2)))
    gain = 10 ** (rng.uniform(*cfg.level_dbfs) / 20) / (rms + eps)
    peak = float(np.abs(noisy).max()) * gain
    if peak > 0.99:
        gain *= 0.99 / peak
    return (noisy * gain).astype(np.float32), (clean * gain).astype(np.float32)


def insert_pause(noisy: np.ndarray, clean: np.ndarray, rng: np.random.Generator, cfg: MixingConfig) -> None:
    """With probability ``cfg.pause_prob``, remove the speech from a random span of ``cfg.pause_seconds`` of
    the mixed pair, in place: the clean part (faded in and out over 10 ms) is subtracted from both, so the
    mixture keeps its noise there. Draws nothing from ``rng`` when ``pause_prob`` is 0."""
    if cfg.pause_prob <= 0.0 or rng.random() >= cfg.pause_prob:
        return
    n = len(clean)
    span = min(round(rng.uniform(*cfg.pause_seconds) * cfg.sample_rate), n)
    start = int(rng.integers(0, n - span + 1))
    ramp = min(round(0.010 * cfg.sample_rate), span // 2)
    window = np.ones(span, np.float32)
    if ramp > 0:
        fade = (0.5 - 0.5 * np.cos(np.pi * np.arange(1, ramp + 1) / (ramp + 1))).astype(np.float32)
        window[:ramp], window[span - ramp :] = fade, fade[::-1]
    removed = clean[start : start + span] * window
    clean[start : start + span] -= removed
    noisy[start : start + span] -= removed
