"""bench/bench_high_band.py end to end on tiny generated pairs with the tiny model (16 kHz pairs get the synthetic
high band; 48 kHz pairs are scored as they are)."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.audio_trees import dev_pairs
from tests.conftest import ROOT, speech_like
from tests.server_fixtures import tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_checkpoint(tmp_path_factory.mktemp("ck") / "tiny.safetensors"))


def _run(pairs: Path, out: Path, ckpt: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "bench/bench_high_band.py",
            "--pairs",
            str(pairs),
            "--out",
            str(out),
            "--checkpoint",
            ckpt,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("rate", [16000, 48000])
def test_table_has_every_system_and_finite_scores(tmp_path: Path, ckpt: str, rate: int) -> None:
    if rate == 16000:
        cleans = [speech_like(1.5, 16000, seed=s).astype(np.float32) for s in (1, 2)]
        pairs = dev_pairs(tmp_path / "pairs", cleans, 0.02, seed=0)
    else:  # real high band: speech with hiss above 8 kHz in both, more in the noisy one
        pairs = tmp_path / "pairs"
        rng = np.random.default_rng(0)
        for sub in ("clean", "noisy"):
            (pairs / "dev" / sub).mkdir(parents=True)
        for i in range(2):
            clean = speech_like(1.5, rate, seed=i).astype(np.float32)
            clean += 0.003 * rng.standard_normal(len(clean)).astype(np.float32)
            noisy = clean + 0.03 * rng.standard_normal(len(clean)).astype(np.float32)
            sf.write(pairs / "dev" / "clean" / f"{i:04d}.wav", clean, rate, subtype="FLOAT")
            sf.write(pairs / "dev" / "noisy" / f"{i:04d}.wav", noisy, rate, subtype="FLOAT")
    out = tmp_path / "out"
    r = _run(pairs, out, ckpt)
    assert r.returncode == 0, r.stderr
    synthetic = 2 if rate == 16000 else 0
    assert f"2 pairs ({synthetic} with the synthetic high band)" in r.stdout
    per_file = _rows(out / "per_file.csv")
    assert [(row["name"], row["system"]) for row in per_file] == [
        (name, system) for name in ("0000", "0001") for system in ("noisy", "drop", "keep", "gate")
    ]
    summary = {row["system"]: row for row in _rows(out / "summary.csv")}
    assert list(summary) == ["noisy", "drop", "keep", "gate"]
    for row in summary.values():
        assert all(math.isfinite(float(row[m])) for m in ("hb_snr_db", "speech_db", "noise_db"))
    # the input against itself; drop leaves (next to) nothing of the band, keep the input's
    assert float(summary["noisy"]["noise_db"]) == 0.0
    assert float(summary["drop"]["noise_db"]) < float(summary["keep"]["noise_db"]) - 10
    assert (out / "summary.md").read_text().count("\n| ") == 5
    assert "the gate's high-band SNR is above drop's in" in (out / "summary.md").read_text()


def test_pairs_at_different_rates_are_refused(tmp_path: Path, ckpt: str) -> None:
    pairs = tmp_path / "pairs"
    for sub, rate in (("clean", 16000), ("noisy", 48000)):
        (pairs / "dev" / sub).mkdir(parents=True)
        sf.write(pairs / "dev" / sub / "0000.wav", speech_like(0.5, rate), rate)
    r = _run(pairs, tmp_path / "out", ckpt)
    assert r.returncode != 0
    assert "0000: clean at 16000 Hz, noisy at 48000 Hz" in r.stderr
