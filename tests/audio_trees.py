"""Generated audio and the folder trees of the training recipes (DNS, VoiceBank-DEMAND, folders + dev pairs).

Everything is synthesised with numpy from fixed seeds, so the trees are identical on every run and tiny: a few
seconds of audio per file. "Speech" is a voiced harmonic signal with a gliding pitch, two formant-like
resonances and a syllable-rate amplitude envelope; "noise" is coloured (pink/brown), bursty (gated white) or hum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf

RATE = 16000


def speech(seconds: float, rate: int = RATE, seed: int = 0, f0: float = 140.0) -> np.ndarray:
    """Voiced, syllable-modulated speech stand-in with peak 0.3 (never silent, never clipped)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    pitch = f0 * (1 + 0.12 * np.sin(2 * np.pi * rng.uniform(0.4, 0.9) * t + rng.uniform(0, 2 * np.pi)))
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    formants = (rng.uniform(500, 800), rng.uniform(1200, 2200))
    voiced = np.zeros_like(t)
    for k in range(1, int(min(4000, rate / 2 - 200) // (1.2 * f0))):
        fk = k * f0
        gain = sum(1 / (1 + ((fk - fm) / 150) ** 2) for fm in formants) + 0.3 / k
        voiced += gain * np.sin(k * phase + rng.uniform(0, 2 * np.pi))
    syllables = np.clip(np.sin(2 * np.pi * rng.uniform(2.5, 4.5) * t + rng.uniform(0, 2 * np.pi)), 0, None)
    x = voiced * (0.05 + syllables**2)
    return (0.3 * x / np.max(np.abs(x))).astype(np.float32)


def noise(seconds: float, rate: int = RATE, seed: int = 0, kind: str = "pink") -> np.ndarray:
    """Noise with peak 0.2: ``pink`` (1/f), ``brown`` (1/f^2), ``bursty`` (gated white) or ``hum`` (50 Hz + noise)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    white = rng.standard_normal(n)
    if kind in ("pink", "brown"):
        spec = np.fft.rfft(white)
        f = np.maximum(np.fft.rfftfreq(n, 1 / rate), 20.0)
        x = np.fft.irfft(spec / (f ** (0.5 if kind == "pink" else 1.0)), n)
    elif kind == "bursty":
        gate = np.repeat(rng.random(n // 800 + 1) < 0.4, 800)[:n]
        x = white * (0.05 + gate)
    elif kind == "hum":
        t = np.arange(n) / rate
        x = sum(np.sin(2 * np.pi * 50 * k * t) / k for k in range(1, 8)) + 0.3 * white
    else:
        raise ValueError(f"unknown noise kind {kind!r}")
    return (0.2 * x / np.max(np.abs(x))).astype(np.float32)


def mixture(clean: np.ndarray, noise_wav: np.ndarray, snr_db: float) -> np.ndarray:
    """``clean + noise`` at ``snr_db`` (noise tiled or cut to the clean length)."""
    reps = -(-len(clean) // len(noise_wav))
    nz = np.tile(noise_wav, reps)[: len(clean)].astype(np.float64)
    gain = np.sqrt(np.mean(clean.astype(np.float64) ** 2) / (np.mean(nz**2) * 10 ** (snr_db / 10)))
    out = clean + gain * nz
    return (out * min(1.0, 0.95 / np.max(np.abs(out)))).astype(np.float32)


def write(path: Path, wav: np.ndarray, rate: int = RATE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, wav, rate, subtype="PCM_16")
    return path


NOISE_KINDS = ("pink", "bursty", "brown", "hum")


@dataclass
class DNSTree:
    root: Path
    clean: list[Path]  # usable clean files
    noise: list[Path]
    bad: dict[str, Path] = field(default_factory=dict)  # reason keyword -> file


def build_dns(root: Path, n_clean: int = 6, n_noise: int = 4, n_test: int = 3) -> DNSTree:
    """A DNS Challenge 2020 tree: datasets/{clean,noise}, the synthetic no_reverb test set, and 4 bad files."""
    clean_dir, noise_dir = root / "datasets" / "clean", root / "datasets" / "noise"
    clean = [
        write(clean_dir / f"book_{i:05d}_chp_0001_reader_{100 + i}_{i}.wav", speech(2.0 + 0.2 * i, seed=i))
        for i in range(n_clean)
    ]
    noises = [
        write(noise_dir / f"{kind}_fileid_{i}.wav", noise(2.5, seed=50 + i, kind=kind))
        for i, kind in enumerate(NOISE_KINDS[:n_noise])
    ]
    bad = {
        "unreadable": clean_dir / "corrupt_fileid_900.wav",
        "silent": write(clean_dir / "silent_fileid_901.wav", np.zeros(2 * RATE, np.float32)),
        "too short": write(clean_dir / "short_fileid_902.wav", speech(0.1, seed=902)),
        "sample rate": write(clean_dir / "narrowband_fileid_903.wav", speech(2.0, 8000, seed=903), 8000),
    }
    bad["unreadable"].write_bytes(b"RIFF\x10\x00\x00\x00garbage, not a wave file" + bytes(range(256)) * 4)
    test = root / "datasets" / "test_set" / "synthetic" / "no_reverb"
    for i in range(n_test):
        c = speech(2.0, seed=300 + i, f0=120 + 20 * i)
        snr = 5 * i
        write(test / "clean" / f"clean_fileid_{i}.wav", c)
        noisy = mixture(c, noise(2.0, seed=400 + i, kind=NOISE_KINDS[i % 4]), snr)
        write(test / "noisy" / f"clnsp{i}_{NOISE_KINDS[i % 4]}_{i}_snr{snr}_tl-25_fileid_{i}.wav", noisy)
    return DNSTree(root, clean, noises, bad)


VB_TRAIN_SPEAKERS = ("p226", "p239", "p270", "p287")
VB_TEST_SPEAKERS = ("p232", "p257")
VB_RATE = 48000


def build_voicebank(
    root: Path,
    speakers: tuple[str, ...] = VB_TRAIN_SPEAKERS,
    utterances: int = 3,
    test_speakers: tuple[str, ...] = VB_TEST_SPEAKERS,
    test_utterances: int = 1,
) -> Path:
    """VoiceBank-DEMAND at 48 kHz: {clean,noisy}_trainset_28spk_wav and {clean,noisy}_testset_wav."""
    sets = (("trainset_28spk", speakers, utterances), ("testset", test_speakers, test_utterances))
    for s, (tag, spk, n_utt) in enumerate(sets):
        for j, name in enumerate(spk):
            for u in range(1, n_utt + 1):
                seed = 1000 * s + 10 * j + u
                c = speech(1.2 + 0.1 * u, VB_RATE, seed=seed, f0=110 + 25 * j)
                nz = noise(1.0, VB_RATE, seed=seed + 500, kind=NOISE_KINDS[(j + u) % 4])
                write(root / f"clean_{tag}_wav" / f"{name}_{u:03d}.wav", c, VB_RATE)
                write(root / f"noisy_{tag}_wav" / f"{name}_{u:03d}.wav", mixture(c, nz, 2.5 + 5 * u), VB_RATE)
    return root


@dataclass
class FolderTree:
    speech: Path
    noise: Path
    dev: Path  # holds dev/{noisy,clean}
    n_dev: int


def build_folders(root: Path, n_speech: int = 6, n_noise: int = 3, n_dev: int = 2) -> FolderTree:
    """Speech and noise folders (nested one level) and a dev-layout pairs folder ``dev/{noisy,clean}/000N.wav``."""
    for i in range(n_speech):
        write(root / "speech" / f"spk{i % 2}" / f"utt{i}.wav", speech(2.0 + 0.25 * i, seed=600 + i))
    for i in range(n_noise):
        write(root / "noise" / f"n{i}.wav", noise(3.0, seed=700 + i, kind=NOISE_KINDS[i % 4]))
    for i in range(1, n_dev + 1):
        c = speech(1.5, seed=800 + i)
        write(root / "devset" / "dev" / "clean" / f"{i:04d}.wav", c)
        write(root / "devset" / "dev" / "noisy" / f"{i:04d}.wav", mixture(c, noise(1.0, seed=850 + i), 5.0))
    return FolderTree(root / "speech", root / "noise", root / "devset", n_dev)


def dev_pairs(root: Path, cleans: list[np.ndarray], noise_std: float, seed: int) -> Path:
    """A dev-layout pairs tree under ``root`` (``dev/{clean,noisy}/NNNN.wav``, float WAV): each clean signal and
    itself plus white noise of ``noise_std``. Returns ``root``."""
    (root / "dev" / "clean").mkdir(parents=True)
    (root / "dev" / "noisy").mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i, clean in enumerate(cleans):
        noisy = clean + noise_std * rng.standard_normal(len(clean)).astype(np.float32)
        sf.write(root / "dev" / "clean" / f"{i:04d}.wav", clean, RATE, subtype="FLOAT")
        sf.write(root / "dev" / "noisy" / f"{i:04d}.wav", noisy, RATE, subtype="FLOAT")
    return root
