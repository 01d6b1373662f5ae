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
