"""Training data through the product's DC blocker (recipes.dc_blocked): what the trainer feeds the network, and what
its validation measures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from enhance.dc_blocker import remove_dc
from enhance.stft import log_magnitude, rebuild, stft
from models.enhancer import Enhancer
from models.registry import get_config
from recipes.audio_pool import list_audio, scan
from recipes.datasets import DataConfig, ValPair
from recipes.dc_blocked import DCBlockedDataset, dc_blocked
from recipes.metrics import si_sdr
from recipes.paired_crops import PairedDataset
from recipes.trainer import RunConfig, saved_run_config
from recipes.validation import validate
from tests.conftest import speech_like

OFFSET = 0.1


def _pairs_with_an_offset(root: Path) -> tuple[PairedDataset, np.ndarray]:
    """Two noisy/clean pairs whose noisy side carries a DC offset (a cheap sound card), as a paired recipe reads
    them; returns the dataset and the first pair's noise."""
    rng = np.random.default_rng(0)
    noises = []
    for i in range(2):
        clean = 0.3 * speech_like(1.5, seed=i)
        noise = (0.02 * rng.standard_normal(len(clean))).astype(np.float32)
        noises.append(noise)
        for side, wav in (("clean", clean), ("noisy", clean + noise + OFFSET)):
            (root / side).mkdir(exist_ok=True)
            sf.write(root / side / f"{i}.wav", wav, 16000, subtype="FLOAT")
    noisy, clean = (scan(list_audio([root / side]), 16000, 0.5) for side in ("noisy", "clean"))
    return PairedDataset(noisy, clean, segment=16000, seed=3), noises[0]


def test_training_examples_are_the_inner_examples_through_the_blocker(tmp_path: Path) -> None:
    inner, _ = _pairs_with_an_offset(tmp_path)
    blocked = DCBlockedDataset(inner)
    assert len(blocked) == len(inner) == 2
    np.testing.assert_array_equal(blocked.order(5), inner.order(5))  # same draws: the order and the crops
    for key in ((0, 0), (4, 1)):
        (noisy, clean), (raw_noisy, raw_clean) = blocked[key], inner[key]
        assert noisy.dtype == clean.dtype == torch.float32
        # as the engines filter a file: from its first sample, in hop-aligned blocks (the same samples)
        np.testing.assert_array_equal(noisy.numpy(), remove_dc(raw_noisy.numpy()[None], 256)[0])
        np.testing.assert_array_equal(clean.numpy(), remove_dc(raw_clean.numpy()[None], 256)[0])
        # the offset is in what the inner recipe reads and gone once the blocker settles (about 30 ms)
        assert raw_noisy[4000:].mean().item() == pytest.approx(OFFSET, abs=0.01)
        assert abs(noisy[4000:].mean().item()) < 1e-3
        # linear: the mixture is still the target plus the (offset) noise, both filtered
        np.testing.assert_allclose(
            (noisy - clean).numpy(), dc_blocked((raw_noisy - raw_clean).numpy()), atol=1e-6
        )


@torch.no_grad()
def test_validation_feeds_the_blocked_input_and_scores_si_sdr_against_the_clean_file(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Enhancer(get_config("tiny")).eval()
    # a reference with an offset of its own
    clean = (0.3 * speech_like(1.5, seed=4) + 0.05).astype(np.float32)
    noisy = (clean + 0.02 * np.random.default_rng(1).standard_normal(len(clean)) + OFFSET).astype(np.float32)
    raw = ValPair("a", noisy, clean)
    on = validate(model, [raw], torch.device("cpu"), dc_blocker=True)
    # loss and PMSQE: exactly those of the pair filtered beforehand (what training compares)
    prefiltered = validate(model, [ValPair("a", dc_blocked(noisy), dc_blocked(clean))], torch.device("cpu"))
    assert on["val_loss"] == pytest.approx(prefiltered["val_loss"], rel=1e-6)
    assert on["val_pmsqe"] == pytest.approx(prefiltered["val_pmsqe"], rel=1e-6)
    # SI-SDR: the estimate from the filtered input against the clean file as it is (as recipes.evaluate scores)
    x = torch.from_numpy(dc_blocked(noisy))[None]
    spec = stft(x, model.cfg.stft)
    est = rebuild(model(log_magnitude(spec)).log_mag, spec, model.cfg.stft, x.shape[-1])[0].numpy()
    assert on["val_si_sdr"] == pytest.approx(si_sdr(clean, est), abs=1e-6)
    assert abs(on["val_si_sdr"] - prefiltered["val_si_sdr"]) > 0.01  # the reference's offset counts
    off = validate(model, [raw], torch.device("cpu"))  # the input as it is, offset included
    assert abs(off["val_loss"] - on["val_loss"]) > 1e-4


def test_runs_saved_before_the_blocker_read_as_trained_without_it() -> None:
    assert DataConfig().dc_blocker is True and RunConfig().data.dc_blocker is True  # new runs
    legacy = saved_run_config({"train": {"model": "tiny"}, "data": {"speech": ["s"], "noise": ["n"]}})
    assert legacy.data.dc_blocker is False and legacy.train.model == "tiny"
    assert saved_run_config({"data": {"dc_blocker": True}}).data.dc_blocker is True
    assert saved_run_config({}).data.dc_blocker is False
