"""Checks on the shared corpus (../shared/data). Opt-in: set TIM_SHARED_DATA to its path (.ci/run does)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED = os.environ.get("TIM_SHARED_DATA")
pytestmark = [
    pytest.mark.shared_data,
    pytest.mark.skipif(not SHARED, reason="set TIM_SHARED_DATA=/path/to/shared/data to run"),
]


def test_training_folders_scan_clean() -> None:
    from recipes.audio_pool import list_audio, scan

    root = Path(str(SHARED))
    speech = scan(list_audio([root / "speech" / "train"]))
    noise = scan(list_audio([root / "noise" / "train"]))
    assert (len(speech), len(noise)) == (998, 246)
    assert speech.skipped == [] and noise.skipped == []
    assert 90 < speech.total_seconds / 60 < 95


def test_dev_pairs_are_found_and_aligned() -> None:
    from recipes.datasets import load_val_pairs

    pairs, bad = load_val_pairs(str(SHARED))
    assert len(pairs) == 120 and bad == []
    assert all(len(p.noisy) == len(p.clean) > 16000 for p in pairs)


def test_pmsqe_agrees_with_pesq_on_real_speech() -> None:
    """The PMSQE loss term (recipes.pmsqe) ranks the first 20 dev pairs' noisy inputs and the bundled model's
    outputs (40 signals) as PESQ-wb does (Spearman rho -0.81 on the first 40 pairs when written)."""
    import numpy as np
    import torch
    from scipy.stats import spearmanr

    from enhance.offline import enhance_waveform
    from enhance.stft import stft
    from models.pretrained import load_pretrained
    from recipes.datasets import load_val_pairs
    from recipes.metrics import pesq_wb
    from recipes.pmsqe import PMSQE

    model = load_pretrained().model
    pairs = load_val_pairs(str(SHARED))[0][:20]
    pm, scores, pesqs = PMSQE(), [], []

    def power(wav: np.ndarray) -> torch.Tensor:
        return stft(torch.from_numpy(wav)[None], model.cfg.stft).abs() ** 2

    for p in pairs:
        for wav in (p.noisy, enhance_waveform(model, p.noisy[None]).wav[0]):
            scores.append(float(pm(power(wav), power(p.clean))))
            pesqs.append(pesq_wb(p.clean, wav))
    rho = spearmanr(scores, pesqs).statistic
    assert rho < -0.6, rho
